"""`mindvl lite info|ask|calibrate|resolution`: the device side on the command line."""
import argparse
import json

from mindvl.choices import LITE_BACKENDS
from mindvl.cli.options import file_bytes


def _info(args) -> None:
    from mindvl.lite.lite_model import backend_report

    rows = backend_report()
    active = next((row["backend"] for row in rows if row["available"]), None)
    if args.json:
        print(json.dumps({"active": active, "backends": rows}, indent=2))
        return
    for row in rows:
        mark = "active" if row["backend"] == active else ("available" if row["available"] else "unavailable")
        print(f"{row['backend']:<15} {mark:<12} {row['detail']}")


def register(commands: argparse._SubParsersAction) -> None:
    lite = commands.add_parser("lite", help="run packages on device runtimes (MindSpore Lite 2.0, GraphCell)")
    sub = lite.add_subparsers(dest="lite_command", required=True)
    info = sub.add_parser("info", help="which runtime LiteModel uses here, and why the others are not used "
                                       "(fetches and prepares the Lite 2.0 runtime on first use)")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    info.set_defaults(func=_info)
    _add_device_commands(sub)


def _milliseconds(timings: dict) -> str:
    return ", ".join(f"{stage} {seconds * 1000:.2f}" for stage, seconds in timings.items())


def _ask(args) -> None:
    import statistics

    from mindvl.lite.cascade import Cascade
    from mindvl.lite.device import DevicePipeline
    from mindvl.lite.lite_model import Context

    image = file_bytes(f"--image {args.image}", args.image)
    audio = file_bytes(f"--audio {args.audio}", args.audio) if args.audio else b""
    if args.repeat < 1:
        from mindvl.lite.lite_model import LiteError
        raise LiteError(f"--repeat {args.repeat}: expected 1 or more")
    with DevicePipeline(args.package, args.backend, threads=1, context=Context(args.threads)) as pipeline:
        if args.cloud:
            if args.calibration:
                cascade = Cascade.from_calibration(args.calibration, pipeline, args.cloud, args.timeout,
                                                   args.servable, args.threshold)
            else:
                cascade = Cascade(pipeline, args.cloud, 0.5 if args.threshold is None else args.threshold,
                                  args.temperature, args.timeout, args.servable)
            with cascade:
                result = cascade.answer(image, args.question or "", audio)
            record = {**result.to_dict(), "threshold": cascade.threshold, "temperature": cascade.temperature}
            if args.json:
                print(json.dumps(record, indent=2))
                return
            print(f"answer: {result.answer} (confidence {result.confidence:.4f}, source {result.source})")
            print(f"edge: {result.edge_answer} (calibrated confidence {result.edge_confidence:.4f}; threshold "
                  f"{cascade.threshold:.6f}, temperature {cascade.temperature:.4f})")
            if result.cloud_error:
                print(f"cloud error: {result.cloud_error}")
            print(f"ms: {_milliseconds(result.timings)}")
            return
        runs = [pipeline.answer(image, args.question or "", audio) for _ in range(args.repeat)]
    result = runs[0]
    warm = {stage: statistics.median(run.timings[stage] for run in runs[1:]) for stage in result.timings} \
        if len(runs) > 1 else None
    if args.json:
        print(json.dumps({"answer": result.answer, "confidence": result.confidence, "answer_text": result.answer_text,
                          "source": "edge", "backend": pipeline.backend, "timings": result.timings,
                          "warm_timings": warm, "threads": result.threads}, indent=2))
        return
    print(f"answer: {result.answer} (confidence {result.confidence:.4f}; generated: {result.answer_text!r}; "
          f"backend {pipeline.backend})")
    print(f"ms, first call: {_milliseconds(result.timings)}")
    if warm:
        print(f"ms, median of the next {len(runs) - 1}: {_milliseconds(warm)}")
    print("preprocessing threads: " + ", ".join(f"{m} {t}" for m, t in result.threads.items()))


def _calibrate(args) -> None:
    from pathlib import Path

    from mindvl.deploy.calibrate import calibrate, format_report
    from mindvl.lite.calibration import CALIBRATION_FILE

    calibration = calibrate(args.package, args.data, split=args.split, modality=args.modality,
                            target_cloud_rate=args.target_cloud_rate, target_accuracy=args.target_accuracy,
                            cloud_accuracy=args.cloud_accuracy, cloud=args.cloud, backend=args.backend,
                            limit=args.limit, servable=args.servable, timeout_s=args.timeout)
    path = calibration.save(args.out or Path(args.package) / CALIBRATION_FILE)
    plots = []
    if args.plot:
        from mindvl.plots.cascade import plot_cascade
        plots = list(plot_cascade(calibration.to_dict(), args.plot))
    if args.json:
        shown = {"plots": [str(p) for p in plots]} if plots else {}
        print(json.dumps({**calibration.to_dict(), "path": str(path), **shown}, indent=2))
        return
    print(format_report(calibration))
    if plots:
        from mindvl.plots.figure import written
        print(written(plots))
    print(f"\nwrote {path} (the full curve: {len(calibration.curve)} thresholds); use it with "
          f"`mindvl lite ask {args.package} --cloud URL --calibration {path}` or Cascade.from_calibration")


def _resolution(args) -> None:
    from mindvl.deploy.resolution_search import format_resolution, resolution_report
    from mindvl.lite.resolution import DEFAULT_VIEWS

    views = [v.strip() for v in args.views.split(",") if v.strip()] if args.views else DEFAULT_VIEWS
    report = resolution_report(args.package, args.data, scale=args.scale, mode=args.mode, views=views,
                               modality=args.modality, limit=args.limit, backend=args.backend,
                               temperature=args.temperature)
    print(json.dumps(report, indent=2) if args.json else format_resolution(report))


def _add_device_commands(sub) -> None:
    # choices are checked where they are used (LiteModel, calibrate, resolution_report), so building the
    # parser imports none of those modules (every `mindvl` command builds it)
    backend_help = f"{', '.join(LITE_BACKENDS)} (default {LITE_BACKENDS.default}): see `mindvl lite info`"
    ask = sub.add_parser("ask", help="answer one question on the device (image decode, tokenising and log-mel in "
                                     "parallel threads, then the package's vqa graph), optionally through the "
                                     "edge-cloud cascade")
    ask.add_argument("package", metavar="PKG", help="model package folder")
    ask.add_argument("--image", required=True, metavar="FILE", help="PNG or JPEG")
    ask.add_argument("--question", help="the typed question")
    ask.add_argument("--audio", metavar="FILE", help="the spoken question (WAV/FLAC/OGG)")
    ask.add_argument("--backend", default=LITE_BACKENDS.default, help=backend_help)
    ask.add_argument("--threads", type=int, default=1, metavar="N", help="CPU threads of the model runtime")
    ask.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="answer N times and also print the median timings of runs 2..N (warm)")
    ask.add_argument("--cloud", metavar="URL", help="the cloud endpoint (http://host:port or host:port for gRPC): "
                                                   "questions the device is unsure of go there")
    ask.add_argument("--servable", default="vqa", help="the cloud's servable (default vqa)")
    ask.add_argument("--calibration", metavar="FILE", help="temperature and threshold from `mindvl lite calibrate` "
                                                           "(a file, or a package folder holding calibration.json)")
    ask.add_argument("--threshold", type=float, help="calibrated confidence at or above which the device answers "
                                                     "(default: the calibration's, else 0.5)")
    ask.add_argument("--temperature", type=float, default=1.0, help="without --calibration (default 1)")
    ask.add_argument("--timeout", type=float, default=5.0, metavar="S",
                     help="seconds to wait for the cloud before answering from the device (default 5)")
    ask.add_argument("--json", action="store_true")
    ask.set_defaults(func=_ask)

    cal = sub.add_parser("calibrate", help="fit the cascade's temperature and threshold on a labelled split and "
                                           "print the accuracy vs cloud-rate curve")
    cal.add_argument("package", metavar="PKG", help="model package folder")
    cal.add_argument("--data", required=True, metavar="ROOT", help="the built data set the package was trained on")
    cal.add_argument("--split", default="validation",
                     help="validation (default: the training images the run held out), test or train")
    cal.add_argument("--modality", default="typed", help="ask the questions typed (default), spoken or both")
    target = cal.add_mutually_exclusive_group()
    target.add_argument("--target-cloud-rate", type=float, metavar="R",
                        help="fraction of questions to send to the cloud (default 0.3)")
    target.add_argument("--target-accuracy", type=float, metavar="A",
                        help="the lowest cloud rate whose overall accuracy reaches A")
    cloud = cal.add_mutually_exclusive_group()
    cloud.add_argument("--cloud-accuracy", type=float, metavar="A",
                       help="assume the cloud answers correctly with probability A (default 1: always)")
    cloud.add_argument("--cloud", metavar="URL", help="measure it: ask this endpoint every question")
    cal.add_argument("--servable", default="vqa", help="the cloud's servable (default vqa)")
    cal.add_argument("--timeout", type=float, default=60.0, metavar="S", help="per cloud request (default 60)")
    cal.add_argument("--backend", default=LITE_BACKENDS.default, help=backend_help)
    cal.add_argument("--limit", type=int, default=0, metavar="N", help="only the first N questions (0: all)")
    cal.add_argument("--out", metavar="FILE", help="where to write it (default PKG/calibration.json)")
    cal.add_argument("--json", action="store_true", help="print the calibration as JSON")
    cal.add_argument("--plot", metavar="STEM", help="also draw accuracy and expected latency against the cloud rate, "
                                                    "the chosen threshold marked, into STEM.png and STEM.svg")
    cal.set_defaults(func=_calibrate)

    res = sub.add_parser("resolution", help="test-time resolution search: accuracy of the plain resize vs views "
                                            "combined, on the test split and on a resized copy of it")
    res.add_argument("package", metavar="PKG", help="model package folder")
    res.add_argument("--data", required=True, metavar="ROOT", help="the built data set (its test split)")
    res.add_argument("--scale", type=int, default=4, help="how many times larger the copy's images are (default 4)")
    res.add_argument("--mode", default="canvas",
                     help="canvas: each image at its own size centred in a SCALE x larger canvas (the scene "
                          "shrinks after the resize); upscale: the image enlarged SCALE x (default canvas)")
    res.add_argument("--views", help="comma-separated grid of full, crop:F, pad:F (0 < F <= 1; default "
                                     "full,crop:0.5,crop:0.25,pad:0.5)")
    res.add_argument("--modality", default="typed", help="typed (default), spoken or both")
    res.add_argument("--temperature", type=float, default=1.0, help="divides the logits (default 1)")
    res.add_argument("--backend", default=LITE_BACKENDS.default, help=backend_help)
    res.add_argument("--limit", type=int, default=0, metavar="N", help="only the first N test questions (0: all)")
    res.add_argument("--json", action="store_true")
    res.set_defaults(func=_resolution)
