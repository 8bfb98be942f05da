"""Deployment: the model package (MindIR graphs + manifest), its verification and evaluation, compression
(INT8, pruning; distillation trains in mindvl.train) and ONNX export."""
