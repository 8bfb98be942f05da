"""`mindvl serve`, `mindvl deploy` and `mindvl query`: a servable directory over MindSpore Serving 2.0's REST and
gRPC protocols, the packages deployed into it, and a client for it."""
import argparse
import json
from pathlib import Path

from mindvl.cli.options import add_key_args, file_bytes
from mindvl.errors import ConfigError

SERVE_FLAGS = ("servable_dir", "host", "port", "grpc_port", "batching", "max_batch_size", "max_wait_ms", "workers",
               "max_request_mb", "max_instances", "timeout_s", "header_timeout_s", "keepalive_s", "max_connections",
               "max_inflight_mb", "decode_slots", "strict_http", "poll_s", "key_file", "key_env", "admin_token_file",
               "admin_token_env", "demo", "prefix_cache_mb", "speculative_tokens")
QUERY_METHODS = {  # the inputs of the methods `mindvl deploy` generates; --input NAME=VALUE for any other
    "predict": ("image", "question", "audio"), "embed_image": ("image",), "embed_text": ("text",),
    "embed_audio": ("audio",)}
QUERY_DEFAULTS = {"predict": {"question": "", "audio": b""}}  # an unasked modality is empty, as the servable expects
FILE_INPUTS = ("image", "audio")


def _serve_config(args):
    """ServeConfig from --config's YAML (unknown keys refused, naming them), the flags given overriding it."""
    from mindvl.config import read_yaml
    from mindvl.serving.serve_config import ServeConfig
    values, source = {}, "flags"
    if args.serve_config:
        path = Path(args.serve_config)
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file")
        values, source = read_yaml(path), f"serve config {path}"
    values.update({name: getattr(args, name) for name in SERVE_FLAGS if getattr(args, name) is not None})
    try:
        return ServeConfig.from_mapping(values)
    except ConfigError as exc:  # flags arrive typed by argparse: only the file can hold a wrong key or type
        raise ConfigError(f"{source}: {exc}") from None


def _serve(args) -> None:
    import logging

    from mindvl.serving.server import serve
    config = _serve_config(args)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("mindvl").setLevel(logging.INFO)
    try:
        serve(config, _cascade_maker(args, config))
    except OSError as exc:  # most often a port another server holds
        raise ConfigError(f"cannot serve on {config.host} (REST port {config.port}, gRPC port {config.grpc_port}): "
                          f"{exc}; choose other ports with --port / --grpc-port (0: any free port)") from None


def _cascade_maker(args, config):
    """--cascade-edge's cascade, made from the server's REST URL (its cloud) once it listens; checked first."""
    if not args.cascade_edge:
        for flag in ("cascade_servable", "cascade_calibration", "cascade_threshold"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')}: needs --cascade-edge PKG (the package answering as "
                                  f"the device)")
        return None
    from mindvl.lite.calibration import CALIBRATION_FILE
    from mindvl.package_reader import MANIFEST
    from mindvl.serving.servable import list_servables

    edge = Path(args.cascade_edge)
    if not (edge / MANIFEST).is_file():
        raise ConfigError(f"--cascade-edge {edge}: not a model package (no {MANIFEST}); pass a folder written by "
                          f"`mindvl export`")
    servable = args.cascade_servable
    if servable is None:
        names = list_servables(config.servable_dir)
        if len(names) != 1:
            raise ConfigError(f"--cascade-servable: {config.servable_dir} holds {len(names)} servables "
                              f"({', '.join(names) or 'none'}); name the one the cascade asks as its cloud")
        servable = names[0]
    calibration = args.cascade_calibration or (edge / CALIBRATION_FILE if (edge / CALIBRATION_FILE).is_file()
                                               else None)

    def make(cloud: str):
        from mindvl.lite.cascade import Cascade
        if calibration:
            return Cascade.from_calibration(calibration, edge, cloud, config.timeout_s, servable,
                                            args.cascade_threshold)
        threshold = 0.5 if args.cascade_threshold is None else args.cascade_threshold
        return Cascade(edge, cloud, threshold, 1.0, config.timeout_s, servable)
    return make


def _deploy(args) -> None:
    from mindvl.serving.servable import deploy
    version, folder = deploy(args.package, args.servable_dir, args.name)
    print(f"deployed {args.package} as {args.name} version {version} in {folder}")
    print(f"a running `mindvl serve --servable-dir {args.servable_dir}` loads it within its --poll-s seconds")


def _query_instance(args) -> dict:
    """The one instance `mindvl query` sends: the named flags, the method's defaults, then each --input."""
    given = {name: getattr(args, name) for name in ("image", "question", "audio", "text")
             if getattr(args, name) is not None}
    takes = QUERY_METHODS.get(args.method)
    for name in given:
        if takes is not None and name not in takes:
            raise ConfigError(f"--{name}: {args.method} takes {', '.join('--' + n for n in takes)}; pass other "
                              f"inputs as --input NAME=VALUE")
    instance = {**QUERY_DEFAULTS.get(args.method, {}),
                **{name: file_bytes(f"--{name} {value}", value) if name in FILE_INPUTS else value
                   for name, value in given.items()}}
    for item in args.inputs:
        name, equals, value = item.partition("=")
        if not name or not equals:
            raise ConfigError(f"--input {item!r}: expected NAME=VALUE (VALUE @PATH sends the file's bytes)")
        instance[name] = file_bytes(f"--input {item}", value[1:]) if value.startswith("@") else value
    missing = [name for name in takes or () if name not in instance]
    if missing or not instance:
        raise ConfigError(f"{args.method}: give {', '.join('--' + n for n in missing) or '--input NAME=VALUE'}")
    return instance


def _describe(value) -> str:
    """An output for people: arrays by dtype, shape, norm and first values; floats to 4 places; bytes by size."""
    import numpy as np
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf" or value.ndim == 0:
            return f"{value.dtype} {list(value.shape)}: {value}"
        head = np.array2string(value.ravel()[:5], precision=4, separator=", ")
        return (f"{value.dtype} {list(value.shape)}, norm {np.linalg.norm(value.astype(np.float64)):.4f}, first "
                f"{head}")
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return str(value)


def _query(args) -> None:
    from mindvl.serving.client import Client, ServingError
    from mindvl.serving.protocol import encode_reply
    instance = _query_instance(args)
    with Client(args.address, args.servable, args.method, args.version) as client:
        result = client.infer(instance)[0]
    if "error" in result and len(result) == 1:
        raise ServingError(f"{args.servable} {args.method}: {result['error']}")
    if args.json:  # the outputs as the REST protocol writes them
        print(json.dumps(json.loads(encode_reply([result]))["instances"][0], indent=2, ensure_ascii=False))
        return
    width = max(map(len, result))
    for name, value in result.items():
        print(f"{name:<{width}}  {_describe(value)}")


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", help="serve a servable directory over MindSpore Serving 2.0's REST and gRPC protocols",
        description="Serves DIR/<servable>/<version>/ (fill it with `mindvl deploy`) until Ctrl-C or SIGTERM; "
                    "flags override the --config file's keys (ServeConfig's names: max_batch_size, ...).")
    serve.add_argument("--servable-dir", metavar="DIR", help="the servable directory (required here or in --config)")
    serve.add_argument("--config", dest="serve_config", metavar="YAML",
                       help="file of settings (unknown keys refused)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, help="REST port (default 1500; 0: any free port)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (default 5500; 0: any free port, -1: no gRPC)")
    serve.add_argument("--max-batch-size", type=int, metavar="N", help="instances batched per model graph run, from concurrent requests (default 16)")
    serve.add_argument("--max-wait-ms", type=float, metavar="MS", help="how long a batch waits to fill (default 2)")
    serve.add_argument("--no-batching", dest="batching", action="store_const", const=False,
                       help="run each request alone (no dynamic batching)")
    serve.add_argument("--workers", type=int, metavar="N", help="threads for preprocessing stages (default 4)")
    serve.add_argument("--max-request-mb", type=float, metavar="MB", help="largest request body (default 32)")
    serve.add_argument("--max-instances", type=int, metavar="N", help="most instances per request (default 64)")
    serve.add_argument("--timeout-s", type=float, metavar="S",
                       help="per request, queueing included; also for a REST body to arrive (default 60)")
    serve.add_argument("--header-timeout-s", type=float, metavar="S",
                       help="a REST request head must arrive within this, or its connection is closed (default 10)")
    serve.add_argument("--keepalive-s", type=float, metavar="S",
                       help="an idle kept-alive REST connection is closed after this (default 15)")
    serve.add_argument("--max-connections", type=int, metavar="N",
                       help="REST connections open at once; more are answered 503 and closed (default 256)")
    serve.add_argument("--max-inflight-mb", type=float, metavar="MB",
                       help="request bodies held at once: REST bodies wait for room; gRPC calls in progress are "
                            "limited to MB / --max-request-mb, more refused RESOURCE_EXHAUSTED (default 512)")
    serve.add_argument("--decode-slots", type=int, metavar="N",
                       help="pixels decoded at once, in images of 4096x4096 (the largest accepted; smaller ones "
                            "share the budget); default 2")
    serve.add_argument("--strict-http", action="store_const", const=True,
                       help="answer the predict protocol's errors with 4xx/5xx too (default: HTTP 200 with "
                            "error_msg there, as MindSpore Serving; every other route carries its status)")
    serve.add_argument("--poll-s", type=float, metavar="S",
                       help="how often DIR is checked for new versions (default 2; 0: never)")
    add_key_args(serve, "encrypted packages (AES-GCM; never a key on the command line)",
                 "file holding the key, raw or as hex text")
    serve.add_argument("--no-demo", dest="demo", action="store_const", const=False,
                       help="no demo page at / (default: served, a client of the same endpoints)")
    serve.add_argument("--prefix-cache-mb", type=float, metavar="MB",
                       help="generative versions keep earlier prompts' cache rows, up to MB each, for prompts that "
                            "start the same way: a system prompt, earlier turns, an image (default 0: off)")
    serve.add_argument("--speculative-tokens", type=int, metavar="N",
                       help="generative versions verify up to N (1-7) prompt-lookup draft tokens a step; the "
                            "answers stay token for token the same (default 0: off)")
    cascade = serve.add_argument_group(
        "edge-cloud cascade for the demo page (POST /cascade): a package that answers on this machine as the device "
        "would, asking this server when unsure")
    cascade.add_argument("--cascade-edge", metavar="PKG", help="the edge's model package")
    cascade.add_argument("--cascade-servable", metavar="NAME",
                         help="the cloud's servable (default: the only one served)")
    cascade.add_argument("--cascade-calibration", metavar="JSON", help="`mindvl lite calibrate`'s file (default: "
                         "PKG/calibration.json where it exists, else threshold 0.5, temperature 1)")
    cascade.add_argument("--cascade-threshold", type=float, metavar="T",
                         help="answer on the edge at this calibrated confidence or above (overrides the calibration)")
    admin = serve.add_argument_group(
        "admin endpoints (POST /servables/<name>/version/<n>:load|unload): off unless a token is given, then only "
        "for 'Authorization: Bearer <token>' (never a token on the command line)")
    admin.add_argument("--admin-token-file", metavar="PATH", help="file holding the token (surrounding whitespace "
                       "ignored)")
    admin.add_argument("--admin-token-env", metavar="VAR", help="environment variable holding the token")
    serve.set_defaults(func=_serve)

    deploy = commands.add_parser("deploy", help="add a model package as the next version of a servable")
    deploy.add_argument("package", metavar="PKG", help="model package folder (from `mindvl export`)")
    deploy.add_argument("--servable-dir", required=True, metavar="DIR", help="the servable directory")
    deploy.add_argument("--name", required=True, help="servable name (letters, digits, '_.-')")
    deploy.set_defaults(func=_deploy)

    query = commands.add_parser(
        "query", help="call a method of a served servable (REST or gRPC) and print its outputs",
        description="Sends one instance built from the flags; predict's missing question is '' and missing "
                    "audio b'' (ask by text, by speech or both).")
    query.add_argument("address", metavar="URL_OR_ADDRESS",
                       help="http://HOST:PORT (REST), or grpc://HOST:PORT or HOST:PORT (gRPC)")
    query.add_argument("--servable", required=True, metavar="NAME")
    query.add_argument("--method", default="predict", help="predict (default), embed_image, embed_text, "
                       "embed_audio, or a method of your servable_config.py")
    query.add_argument("--version", type=int, default=0, metavar="N", help="version to ask (default 0: the newest)")
    query.add_argument("--image", metavar="PATH", help="PNG or JPEG file (predict, embed_image)")
    query.add_argument("--question", metavar="TEXT", help="typed question (predict)")
    query.add_argument("--audio", metavar="PATH", help="WAV, FLAC or OGG file: a spoken question (predict, "
                       "embed_audio)")
    query.add_argument("--text", metavar="TEXT", help="text to embed (embed_text)")
    query.add_argument("--input", dest="inputs", action="append", default=[], metavar="NAME=VALUE",
                       help="any other input as a string, or @PATH for a file's bytes (repeatable)")
    query.add_argument("--json", action="store_true", help="print the outputs as the REST reply's JSON")
    query.set_defaults(func=_query)
