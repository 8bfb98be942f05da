"""Writing model packages: MindIR graphs + manifest (package_writer.py, graphs.py), a generative model's
attachments / prefill / decode graphs over one weights file (prefill_decode.py, shared_weights.py), the
MindSpore Lite 2.0 graphs (lite2_folder.py, lite2_mindir.py), INT8 compression (quantize.py) and ONNX
(onnx.py). Verifying, evaluating and calibrating a package prepare a deployment: mindvl.deploy."""
