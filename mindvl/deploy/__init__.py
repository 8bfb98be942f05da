"""Preparing a deployment from a model package and data: writing, verifying and evaluating a package in one
step (export_pipeline.py, verify.py, evaluate_package.py), the edge-cloud cascade's calibration
(calibrate.py) and the resolution-search report (resolution_search.py).

It sits above mindvl.lite and mindvl.serving because it runs them: the device pipeline on a data split, the
server's client as the cascade's cloud, the Lite 2.0 runtime a package targets. mindvl.export, which only
writes packages, sits below both.
"""
