"""`mindvl lite ...`: the device side on the command line."""
import json


def _info(args) -> None:
    from mindvl.lite.model import backend_report

    rows = backend_report()
    active = next((row["backend"] for row in rows if row["available"]), None)
    if args.json:
        print(json.dumps({"active": active, "backends": rows}, indent=2))
        return
    for row in rows:
        mark = "active" if row["backend"] == active else ("available" if row["available"] else "unavailable")
        print(f"{row['backend']:<15} {mark:<12} {row['detail']}")


def add_lite_commands(commands) -> None:
    lite = commands.add_parser("lite", help="run packages on device runtimes (MindSpore Lite 2.0, GraphCell)")
    sub = lite.add_subparsers(dest="lite_command", required=True)
    info = sub.add_parser("info", help="which runtime LiteModel uses here, and why the others are not used "
                                       "(fetches and prepares the Lite 2.0 runtime on first use)")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    info.set_defaults(func=_info)
