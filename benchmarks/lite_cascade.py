"""The edge-cloud cascade against a live `mindvl serve`: where questions go, how right and how fast.

    python benchmarks/lite_cascade.py --package PKG --data ROOT [--questions 500] [--calibration FILE]

The package is deployed and served on free local ports (the cloud); the cascade's edge is the same
package on the device runtime (Lite 2.0 where available), with the temperature and threshold of
`mindvl lite calibrate` (PKG/calibration.json by default). The first --questions typed test questions
go through the cascade, then the first 100 again with the cloud on a closed port (every cloud call falls
back to the edge). Prints, per source (edge / cloud / edge_fallback): questions, accuracy, median ms.
"""
import argparse
import socket
import statistics
import tempfile
from pathlib import Path


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def run(cascade, examples) -> dict:
    from mindvl.lite.calibration import example_item

    rows = {}
    for example in examples:
        result = cascade.answer(**example_item(example, "typed"))
        row = rows.setdefault(result.source, {"questions": 0, "correct": 0, "ms": []})
        row["questions"] += 1
        row["correct"] += result.answer == example.answer
        row["ms"].append(1000 * result.timings["total"])
    return rows


def table(title: str, rows: dict) -> str:
    lines = [f"{title}", "| source | questions | accuracy | median ms |", "|---|---|---|---|"]
    for source, row in rows.items():
        lines.append(f"| {source} | {row['questions']} | {row['correct'] / row['questions']:.1%} | "
                     f"{statistics.median(row['ms']):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True)
    parser.add_argument("--data", required=True, help="the data set the package was trained on")
    parser.add_argument("--calibration", help="calibration file (default: PKG/calibration.json)")
    parser.add_argument("--questions", type=int, default=500)
    args = parser.parse_args()

    from mindvl.data.reading.examples import query_examples
    from mindvl.lite.cascade import Cascade
    from mindvl.lite.device import DevicePipeline
    from mindvl.serving.servable import deploy
    from mindvl.serving.serve_config import ServeConfig
    from mindvl.serving.server import BackgroundServer

    examples = query_examples(args.data, args.questions)
    with tempfile.TemporaryDirectory() as servables, DevicePipeline(args.package) as edge:
        deploy(args.package, servables, "vqa")
        with BackgroundServer(ServeConfig(servable_dir=servables, port=0, grpc_port=-1, poll_s=0)) as server:
            with Cascade.from_calibration(args.calibration or args.package, edge, server.rest_url) as cascade:
                print(f"edge on {edge.backend}; temperature {cascade.temperature:.3f}, threshold "
                      f"{cascade.threshold:.4f}")
                print(table(f"\n{len(examples)} typed test questions, cloud = mindvl serve (REST)",
                            run(cascade, examples)))
        with Cascade.from_calibration(args.calibration or args.package, edge,
                                      f"http://127.0.0.1:{closed_port()}", timeout_s=2.0) as cascade:
            print(table(f"\nfirst 100 again, cloud on a closed port", run(cascade, examples[:100])))


if __name__ == "__main__":
    main()
