"""mindvl.lite: model packages on device runtimes (MindSpore Lite 2.0, GraphCell), the C++ runner's
assets, and the edge-cloud cascade. Imported lazily: `import mindvl.lite` loads neither MindSpore nor Lite."""

_EXPORTS = {"LiteModel": "model", "Context": "model", "LiteTensor": "model", "LiteError": "model",
            "backend_report": "model",
            "DevicePipeline": "device", "DeviceAnswer": "device",
            "Cascade": "cascade", "CascadeAnswer": "cascade",
            "Calibration": "calibration", "CalibrationError": "calibration",
            "load_calibration": "calibration",
            "ResolutionSearch": "resolution"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"mindvl.lite.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'mindvl.lite' has no attribute {name!r}")
