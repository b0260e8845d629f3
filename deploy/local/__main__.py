"""``python -m deploy.local up|down|status|env``: the local PostgreSQL + Kafka stack (and
optionally an Apicurio Schema Registry: ``up --registry``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.local import jars, stack
from deploy.local.errors import LauncherError
from deploy.local.kafka import LocalKafka
from deploy.local.postgres import LocalPostgres
from deploy.local.registry import LocalRegistry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local",
        description=(
            "Start and stop a real PostgreSQL and Kafka on free loopback ports. "
            "CDC_POSTGRES_VERSION=15..18 picks PostgreSQL's major version for a new stack."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the stack (idempotent) and write the env file")
    up.add_argument(
        "--registry",
        action="store_true",
        help="also start an Apicurio Schema Registry (needs Java 21+; kept from then on)",
    )
    down = sub.add_parser("down", help="stop the stack")
    down.add_argument("--wipe", action="store_true", help="also delete its data")
    sub.add_parser("status", help="say what is running")
    sub.add_parser("env", help="print the env file's KEY=value lines")
    resolve = sub.add_parser(
        "jars",
        help=(
            f"resolve jar sets with Maven (default: {' and '.join(jars.JAR_SETS)}; on demand: "
            f"{', '.join(jars.ON_DEMAND_JAR_SETS)})"
        ),
    )
    resolve.add_argument("sets", nargs="*", default=list(jars.JAR_SETS))
    parser.add_argument("--env-file", type=Path, default=stack.ENV_FILE)
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            state = stack.up(env_file=args.env_file, registry=args.registry)
            print(f"postgres  {state.postgres.dsn} (PostgreSQL {state.postgres.cluster_version()})")
            print(f"kafka     {state.kafka.bootstrap_servers}")
            if state.registry is not None:
                print(f"registry  {state.registry.url}")
            print(f"env file  {args.env_file}")
        elif args.command == "down":
            stopped = stack.down(wipe=args.wipe, env_file=args.env_file)
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        elif args.command == "status":
            loaded = stack.load()
            if loaded is None:
                print("no local stack (run `make up`)")
                return 1
            services: list[tuple[str, LocalPostgres | LocalKafka | LocalRegistry]] = [
                ("postgres", loaded.postgres),
                ("kafka", loaded.kafka),
            ]
            if loaded.registry is not None:
                services.append(("registry", loaded.registry))
            for name, svc in services:
                print(f"{name:9} {'running' if svc.running() else 'stopped'}")
        elif args.command == "env":
            loaded = stack.load()
            if loaded is None:
                print("no local stack (run `make up`)", file=sys.stderr)
                return 1
            for key, value in loaded.env().items():
                print(f"{key}={value}")
        elif args.command == "jars":
            for name in args.sets:
                print(f"{name:6} {jars.resolve(name)}")
    except LauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
