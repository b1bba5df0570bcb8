"""`fastfeed profile`: measure a training script as it runs, attribute its step time, and say what limits it.

probe.py runs inside the profiled processes (hooks, the measured window), report.py turns their records into the
table and the comparison with a baseline run, rules.py holds the verdict's rules, run.py launches the command.
"""
