"""The Loader's online tuners, both measured on the training loop's own pace and owned by the Loader.

    pace.py       ConsumerPace: when the loop takes each batch; one try at a time between the tuners
    pipelines.py  PipelineTuner: how many decode pipelines run side by side
    climber.py    ShareClimber: the hybrid decoder's CPU share of each batch
Pure Python, no torch: tested on replayed and simulated loops.
"""
