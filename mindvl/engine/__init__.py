"""The generation engine: one decode loop (decode_loop.DecodeBatch) for the framework's cells, a model package's
graphs on the server and in `export verify`, and the device runtime.

    sampling.py        SamplingConfig, choosing the next token, Delta / Generation, stop handling
    prompts.py         prompts as graph inputs (TextLayout, PromptLayout) and the GenerationLimits they keep
    decode_loop.py     DecodeBatch: prefill, join, step, sample, stop, leave; generate / stream
    package_graphs.py  a package's attachments / prefill_<L> / decode graphs as the engine's graphs

A leaf of the import layers beside config and chat: it loads no MindSpore (the graphs object does), so
serving and lite run it.
"""
