"""The generation engine: one decode loop (decode_loop.DecodeBatch) for the framework's cells, a model package's
graphs on the server and in `export verify`, and the device runtime.

    sampling.py        SamplingConfig, choosing the next token, Delta / Generation, stop handling
    prompts.py         prompts as graph inputs (TextLayout, PromptLayout) and the GenerationLimits they keep
    decode_loop.py     DecodeBatch: prefill, join, step, sample, stop, leave; generate / stream
    package_graphs.py  a package's attachments / prefill_<L> / decode graphs as the engine's graphs
    native_prompts.py  native-resolution prompts (images and video of their own sizes) as graph inputs
    vision_layout.py   where each patch of packed native-resolution images goes (Qwen2(.5)-VL's tower, DINOv2's)
    position_table.py  a ViT's square position table at other grids (DINOv2's bicubic interpolation)

A leaf of the import layers beside config and chat: it loads no MindSpore (the graphs object does), so
serving and lite run it.
"""
