"""Vision models (``kind: cnn``): :mod:`~dessim.workload.vision.cnn` (file schema, task graph)
and :mod:`~dessim.workload.vision.cnn_models` (ResNet-50 and ViT layer lists)."""
