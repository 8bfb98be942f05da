"""Shared test setup: quiet MindSpore's C++ logging before any test imports it."""
import os

os.environ.setdefault("GLOG_v", "3")
