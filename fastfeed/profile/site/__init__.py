"""The sitecustomize `fastfeed profile` puts first on PYTHONPATH (a package only so that wheels carry it)."""
