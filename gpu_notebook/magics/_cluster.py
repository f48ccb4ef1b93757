"""``%gpu_cluster``: start, inspect, resize and stop clusters (thin over :class:`gpu_notebook.Cluster`)."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpu_notebook.cloud import CloudLauncher, active_states
from gpu_notebook.cluster import (
    CloudLaunch,
    Cluster,
    DetachedCluster,
    Policies,
    Resources,
    Runtime,
    detached_records,
    get_manager,
    rank_env,
    worker_setup,
)
from gpu_notebook.cluster.providers import cloud_spec
from gpu_notebook.doctor import bench_allreduce, bench_scaling, diagnose, diagnose_local
from gpu_notebook.magics._args import (
    budget_usd,
    convert,
    count,
    idle_minutes,
    k8s_namespace,
    name,
    number,
    path,
    rank_number,
    size,
    text,
)
from gpu_notebook.magics._common import (
    MagicError,
    Option,
    option,
    options,
    parse,
    progress_printer,
    refuse_others,
    reported,
    show,
    shown_short,
    subcommands,
    usage_error,
    usage_errors,
)
from gpu_notebook.magics._detach import ATTACH_ARGS, DETACH_ARGS, attach
from gpu_notebook.magics._workshop import (
    STUDENTS_ARGS,
    WORKSHOP_ARGS,
    WORKSHOP_START_ARGS,
    start_student,
    students,
    workshop,
)

#: the most workers a notebook's cluster may have (more is a typo: 100000 workers is $50,000 an hour)
MAX_WORKERS = 1024
#: the smallest message the all-reduce benchmark times (nccl-tests' default -b 8)
MIN_BENCH_BYTES = 8

COMMANDS = ["start", "status", "stop", "scale", "list", "use", "logs", "stacks", "restart", "doctor", "bench"]
COMMANDS += ["env", "attach"]
COMMANDS += ["workshop", "students"]  # magics/_workshop.py

#: the cluster a command is about; --cluster is the same option, as %%distributed and %gpu_run spell it
NAME = option(
    "--name",
    "--cluster",
    type=name("cluster name"),
    help="start: the cluster's name (default local, local-2, ...); other commands: NAME",
)
#: what a new cluster looks like (local, or connected to an existing Ray at --address)
START_ARGS = (
    option(
        "--workers",
        "-n",
        type=count("workers", maximum=MAX_WORKERS),
        metavar="N",
        help="start: number of workers (default: one per GPU, else 2)",
    ),
    option(
        "--cpus-per-worker",
        type=number("CPUs", maximum=1024),
        metavar="CPUS",
        help="start: CPUs per worker; fractions allowed (e.g. 0.5)",
    ),
    option(
        "--gpus-per-worker",
        type=number("GPUs", maximum=64, allow_minimum=True),
        metavar="GPUS",
        help="start: GPUs per worker (default 1 with GPUs, else 0); local or --address clusters "
        "(--cloud: --gpu TYPE:COUNT)",
    ),
    option(
        "--address",
        type=text("an address: auto, host:port or ray://host:port"),
        help="start: connect to an existing Ray cluster: auto, host:port or ray://host:port "
        "(default: RAY_ADDRESS when set, else a local Ray; local: always a local Ray)",
    ),
    option("--dashboard", action="store_true", help="start: also start Ray's dashboard (local cluster)"),
    option(
        "--backend", choices=["auto", "gloo", "nccl"], default="auto", help="start: torch.distributed backend"
    ),
    option(
        "--gpu-visibility",
        choices=["node", "own"],
        default="node",
        help="start: each worker sees its node's workers' GPUs, local rank k's GPU as cuda:k, as under torchrun "
        "(node, the default), or only its own GPUs, as cuda:0 (own)",
    ),
)
#: what the workers start with (Ray's runtime_env, fixed when they start); values of --env are never shown
ENV_ARGS = (
    option(
        "--working-dir",
        type=path("directory"),
        metavar="DIR",
        help="start: the workers run in a copy of DIR (on every node)",
    ),
    option(
        "--pip",
        nargs="+",
        action="extend",
        type=text("a pip requirement such as torch==2.3"),
        metavar="PKG",
        help="start: pip packages the workers install",
    ),
    option(
        "--env",
        action="append",
        type=text("KEY or KEY=VALUE"),
        metavar="KEY[=VALUE]",
        help="start: a variable for the workers; KEY alone takes the kernel's value (keeps secrets out of "
        "the notebook); values are never shown",
    ),
    option(
        "--env-file",
        action="append",
        type=path("file"),
        metavar="FILE",
        help="start: KEY=VALUE lines for the workers (.env)",
    ),
)
#: a cluster launched on cloud GPUs (each needs --cloud)
CLOUD_ARGS = (
    option(
        "--cloud",
        choices=["aws", "gcp", "azure", "kubernetes"],
        help="start: launch cloud GPUs (Ray's cluster launcher)",
    ),
    option(
        "--region",
        type=text("a region such as us-east-1"),
        help="start --cloud aws|gcp|azure: region, e.g. us-east-1",
    ),
    option(
        "--gpu",
        type=text("a GPU type and count such as A100:8"),
        help="start --cloud: GPU type and count per node, e.g. A100:8",
    ),
    option(
        "--instance-type",
        type=text("an instance type such as p4d.24xlarge"),
        help="start --cloud: an exact instance type instead of --gpu, e.g. p4d.24xlarge",
    ),
    option(
        "--spot", action="store_true", help="start --cloud: spot/preemptible instances (checkpoint often)"
    ),
    option("--dry-run", action="store_true", help="start --cloud: print the config and cost; launch nothing"),
    option(
        "--max-workers",
        type=count("worker nodes", maximum=MAX_WORKERS),
        metavar="N",
        help="start --cloud: autoscaling limit of worker nodes (at least --workers)",
    ),
    option("--project", type=text("a GCP project id"), help="start --cloud gcp: the GCP project"),
    option("--namespace", type=k8s_namespace(), help="start --cloud kubernetes: the namespace"),
    option(
        "--no-tunnel", action="store_true", help="start --cloud: connect to the head directly, not via SSH"
    ),
)
#: the cost policies a new cluster starts with
POLICY_ARGS = (
    option(
        "--idle-stop",
        type=idle_minutes(),
        metavar="MINUTES",
        help="start: stop the cluster after this many idle minutes; workshop start: each student's seat",
    ),
    option(
        "--budget",
        type=budget_usd(),
        metavar="USD",
        help="start: warn at 80%%, checkpoint and stop at 100%% of this; workshop start: per student",
    ),
)
ALLREDUCE_ARGS = (
    option(
        "--max-bytes",
        type=size(minimum=MIN_BENCH_BYTES),
        default=128 * 2**20,
        metavar="SIZE",
        help="bench allreduce: largest message, e.g. 64M (default 128M; at least 8 bytes)",
    ),
    option(
        "--iters",
        type=count("iterations", maximum=100_000),
        metavar="N",
        default=20,
        help="bench allreduce: timed iterations per size (default 20)",
    ),
)
SCALING_ARGS = (
    option(
        "--steps",
        type=count("steps", maximum=100_000),
        metavar="N",
        default=30,
        help="bench scaling: training steps per size (default 30)",
    ),
)
LOCAL = option(
    "--local", action="store_true", help="doctor: only this machine and process (no cluster needed)"
)
NATIVE = option(
    "--native",
    action="store_true",
    help="stacks: also each cell thread's native frames (py-spy, on the workers)",
)
LOGS_ARGS = (
    option("--rank", type=rank_number(maximum=MAX_WORKERS), help="logs: only this rank"),
    option(
        "--tail",
        type=count("lines", maximum=1_000_000),
        metavar="LINES",
        default=50,
        help="logs: lines per rank (default 50)",
    ),
)
ALL = option(
    "--all", action="store_true", help="stop: every cluster of this kernel; students stop: every student"
)
ADDRESS = next(o for o in START_ARGS if o.flag == "--address")

#: the options each subcommand takes; any other option given is a usage error, never ignored
#: (``stop --dry-run`` must not stop the cluster; ``stop --name big`` must not stop the current one instead)
OPTIONS: dict[str, tuple[Option, ...]] = {
    "start": (NAME, *START_ARGS, *DETACH_ARGS, *ENV_ARGS, *CLOUD_ARGS, *POLICY_ARGS, *WORKSHOP_START_ARGS),
    "status": (NAME,),
    "stop": (NAME, ALL),
    "scale": (),
    "list": (),
    "use": (NAME,),
    "logs": (NAME, *LOGS_ARGS),
    "stacks": (NAME, NATIVE),
    "restart": (NAME,),
    "doctor": (NAME, LOCAL),
    "bench": (*ALLREDUCE_ARGS, *SCALING_ARGS),
    "env": (NAME,),
    "attach": (NAME, ADDRESS, *ATTACH_ARGS),
    "workshop": (ADDRESS, *POLICY_ARGS, *WORKSHOP_ARGS),
    "students": (WORKSHOP_START_ARGS[0], ALL, *STUDENTS_ARGS),
}
#: the options of each benchmark: one of the other's is refused (a usage error, never silently ignored)
BENCH_OPTIONS = {"bench allreduce": ALLREDUCE_ARGS, "bench scaling": SCALING_ARGS}

#: what each subcommand takes after its name, for its usage line
POSITIONALS = {
    "scale": "N",
    "use": "NAME",
    "bench": "{allreduce,scaling}",
    "workshop": "{start,stop,status} [NAME]",
    "students": "[stop ID]",
    "attach": "[NAME]",
    **{c: "[NAME]" for c in ("status", "stop", "logs", "stacks", "restart", "doctor", "env")},
}

# the option groups as decorators, in the order %gpu_cluster? lists them
name_arg = options(NAME)
start_args = options(*START_ARGS, *DETACH_ARGS, *ATTACH_ARGS)
env_args = options(*ENV_ARGS)
cloud_args = options(*CLOUD_ARGS)
policy_args = options(*POLICY_ARGS)
bench_args = options(*ALLREDUCE_ARGS, *SCALING_ARGS)
doctor_args = options(LOCAL)
stacks_args = options(NATIVE)
logs_args = options(*LOGS_ARGS)
stop_args = options(ALL)
workshop_args = options(*WORKSHOP_START_ARGS, *WORKSHOP_ARGS, *STUDENTS_ARGS)


@magics_class
class ClusterMagics(Magics):
    """The ``%gpu_cluster`` magic."""

    @magic_arguments()
    @argument("command", nargs="?", choices=COMMANDS, help="what to do")
    @argument(
        "args",
        nargs="*",
        help="scale: N; use: NAME; bench: allreduce or scaling; "
        "status, stop, logs, stacks, restart, doctor, env: [NAME] (default: the current cluster); "
        "workshop: start NAME, stop [NAME] or status [NAME]; students: [stop ID]",
    )
    @name_arg
    @start_args
    @env_args
    @cloud_args
    @policy_args
    @bench_args
    @doctor_args
    @stacks_args
    @logs_args
    @stop_args
    @workshop_args
    @subcommands(OPTIONS, POSITIONALS)
    @line_magic
    def gpu_cluster(self, line: str) -> Any:
        """Start, inspect, resize and stop the Ray cluster that runs %%distributed cells.

        Examples
        --------
        In [1]: %gpu_cluster start --workers 2 --cpus-per-worker 0.5
        In [2]: %gpu_cluster status
        In [3]: %gpu_cluster scale 4
        In [4]: %gpu_cluster logs --rank 1 --tail 20
        In [5]: %gpu_cluster start --name big --address 10.0.0.5:6379
        In [6]: %gpu_cluster list
        In [7]: %gpu_cluster use local
        In [8]: %gpu_cluster doctor
        In [9]: %gpu_cluster bench allreduce --max-bytes 64M
        In [10]: %gpu_cluster start --cloud aws --region us-east-1 --gpu A100:8 --workers 2 --spot --dry-run
        In [11]: %gpu_cluster start --working-dir . --env HF_TOKEN --env NCCL_DEBUG=INFO --env-file .env
        In [12]: %gpu_cluster env
        In [13]: %gpu_cluster stop
        In [14]: %gpu_cluster workshop start ml101 --quota-cpus 2 --budget 5 --price-cpu-hour 0.05
        In [15]: %gpu_cluster start --address 10.0.0.5:6379 --workshop ml101 --student alice
        In [16]: %gpu_cluster students
        In [17]: %gpu_cluster students stop bob
        In [18]: %gpu_cluster stacks
        In [19]: %gpu_cluster start --detach --name run1 --idle-stop 30
        In [20]: %gpu_cluster attach run1
        """
        args = parse(self.gpu_cluster, line)
        if args.command is None:
            raise usage_error(self.gpu_cluster, "%gpu_cluster needs a command, e.g. %gpu_cluster start")
        handler = getattr(self, f"_cmd_{args.command}")
        try:
            with reported(self.gpu_cluster, strip_quotes=True, command=args.command):
                self._check_options(args)
                return handler(args)
        except KeyboardInterrupt:
            if args.command != "start":
                raise
            # Cluster.start undid what it had started (local Ray, workers, cloud instances): say so, not Ray's frames
            raise shown_short(
                MagicError(
                    "interrupted: the cluster was not started, and what had started was shut down. "
                    "Run %gpu_cluster start again when ready."
                )
            ) from None

    # ---- subcommands ------------------------------------------------------------------------------------------
    def _check_options(self, args: argparse.Namespace) -> None:
        refuse_others(args, OPTIONS, args.command)
        # NAME positionally or as --name (as for start): the same thing, said once
        if args.command != "start" and args.name is not None:
            if args.args and args.args[0] != args.name:
                raise UsageError(
                    f"{args.command}: the cluster named twice ({args.args[0]!r} and --name {args.name!r})"
                )
            if not args.args:
                args.args = [args.name]

    def _check_cloud_options(self, args: argparse.Namespace) -> None:
        """What a cloud would silently ignore is refused instead."""
        if args.gpus_per_worker is not None:
            raise UsageError(
                "--gpus-per-worker is for local and --address clusters; on a cloud, say the GPUs per node "
                "with --gpu TYPE:COUNT (e.g. --gpu A100:8) or --instance-type"
            )
        if args.cloud == "kubernetes" and args.region is not None:
            raise UsageError(
                "--region does not apply to --cloud kubernetes (the cluster is where kubectl's context "
                "points); use --namespace"
            )
        if args.cloud != "kubernetes" and args.namespace is not None:
            raise UsageError("--namespace applies to --cloud kubernetes only")
        if args.cloud != "gcp" and args.project is not None:
            raise UsageError("--project applies to --cloud gcp only")

    def _no_extra(self, args: argparse.Namespace) -> None:
        if args.args:
            raise UsageError(f"{args.command} takes no positional arguments (got {' '.join(args.args)})")

    def _cmd_start(self, args: argparse.Namespace) -> None:
        self._no_extra(args)
        cloud_only = [o for o in CLOUD_ARGS if o.dest != "cloud" and getattr(args, o.dest)]
        if cloud_only and not args.cloud:
            raise UsageError(f"{cloud_only[0].flag} needs --cloud aws|gcp|azure|kubernetes")
        launch: dict[str, Any] = {}
        if args.cloud:
            if args.address:
                raise UsageError(
                    "--cloud launches a new cluster; --address connects to an existing one: pick one"
                )
            self._check_cloud_options(args)
            launch.update(
                cloud=args.cloud,
                region=args.region,
                gpu=args.gpu,
                instance_type=args.instance_type,
                spot=args.spot,
                max_workers=args.max_workers,
                project=args.project,
                namespace=args.namespace,
                connect="direct" if args.no_tunnel else None,
            )
        # --working-dir, --pip, --env, --env-file: checked before anything starts (no value is ever echoed)
        setup = worker_setup(args.working_dir, args.pip or (), args.env or (), args.env_file or ())

        def kwargs() -> dict[str, Any]:
            """The cluster's settings, grouped (their dataclasses check the values)."""
            return dict(
                name=args.name,
                address=args.address,
                resources=Resources(
                    workers=args.workers,
                    cpus_per_worker=args.cpus_per_worker,
                    gpus_per_worker=args.gpus_per_worker,
                    backend=args.backend,
                ),
                runtime=Runtime(
                    gpu_visibility=args.gpu_visibility,
                    dashboard=args.dashboard,
                    worker_setup=setup,
                    detach=args.detach,
                    log_to=args.log_to,
                ),
                policies=Policies(idle_stop=args.idle_stop, budget=args.budget),
                launch=CloudLaunch(**launch),
            )

        if args.log_to and not args.detach:
            raise UsageError("--log-to goes with --detach (the ranks' log files of a detached cluster)")
        if args.workshop or args.student:
            if args.detach:
                raise UsageError(
                    "--detach and --workshop: a workshop student's workers outlive the kernel already"
                )
            if not args.workshop:
                raise UsageError("--student goes with --workshop NAME (the workshop the teacher started)")
            if args.name is None:
                self._refuse_second_start()
            return start_student(args, kwargs)
        with usage_errors(ValueError):  # Cluster's own checks: --workers 0, --cpus-per-worker -1
            cluster = Cluster(**kwargs())
        if args.cloud:
            cloud_spec(
                cluster
            )  # the cloud request's own checks (--gpu TYPE:COUNT, the name), before any launch
        if args.dry_run:
            show(cluster.plan())
            return
        if args.name is None and not args.cloud:
            self._refuse_second_start()
        cluster.start(progress=progress_printer())

    def _refuse_second_start(self) -> None:
        """Re-running the start cell must not start a second cluster next to the first: that takes a name."""
        manager = get_manager()
        running = [c for c in manager.list() if c.running]
        if not running:
            return
        c = manager.current if manager.current in running else running[-1]
        raise MagicError(
            f"cluster {c.name!r} is already running ({c.world_size} workers, {c.backend}); nothing was started. "
            f"Use it as it is, resize it with %gpu_cluster scale N, get fresh workers with %gpu_cluster restart, "
            f"or stop it first (%gpu_cluster stop). To run a second cluster next to it, give it a name: "
            f"%gpu_cluster start --name NAME ..."
        )

    def _cmd_status(self, args: argparse.Namespace) -> None:
        if args.args and get_manager().get(args.args[0], None) is None and _saved_cloud(args.args[0]):
            info = CloudLauncher().status(args.args[0])
            show(info["state"])
            nodes = info.get("nodes")
            print(
                f"cloud API: {len(nodes) if nodes is not None else 'unknown'} instance(s) tagged with this cluster"
            )
            return
        cluster = self._pick(args)
        show(cluster.status())

    def _cmd_stop(self, args: argparse.Namespace) -> None:
        if args.all:
            for msg in get_manager().stop_all("stopped by the user"):
                print(msg)
            return
        if args.args and get_manager().get(args.args[0], None) is None and _saved_cloud(args.args[0]):
            # a cloud cluster a previous kernel started: tear it down from its saved state
            show(CloudLauncher().teardown(args.args[0], progress=progress_printer()))
            return
        print(self._pick(args).stop())
        current = get_manager().current
        if current is not None:  # the next %%distributed runs there, not nowhere
            print(
                f"current cluster is now {current.name!r} ({current.world_size} workers); "
                f"%gpu_cluster stop --all stops every cluster"
            )

    def _cmd_scale(self, args: argparse.Namespace) -> None:
        if len(args.args) != 1:
            raise UsageError("scale takes one argument: the new number of workers, e.g. %gpu_cluster scale 4")
        workers = convert(
            count("workers", maximum=MAX_WORKERS),
            args.args[0],
            "scale takes one argument (the new number of workers)",
        )
        print(get_manager().require_current().scale(workers, progress=progress_printer()))

    def _cmd_restart(self, args: argparse.Namespace) -> None:
        print(self._pick(args).restart(progress=progress_printer()))

    def _cmd_doctor(self, args: argparse.Namespace) -> None:
        if args.local:
            show(diagnose_local())
            return
        # the doctor is often the first thing run on a new machine (is the driver right for this torch?)
        alone = "; or check this machine and kernel alone (driver, CUDA, torch): %gpu_cluster doctor --local"
        show(diagnose(self._pick(args, instead=alone)))

    def _cmd_bench(self, args: argparse.Namespace) -> None:
        if len(args.args) != 1 or args.args[0] not in ("allreduce", "scaling"):
            raise UsageError(
                "bench takes one argument: allreduce or scaling, e.g. %gpu_cluster bench allreduce"
            )
        kind = args.args[0]
        # the arguments are checked before any cluster is needed; an option of the other benchmark is an error
        refuse_others(args, BENCH_OPTIONS, f"bench {kind}")
        cluster = get_manager().require_current()
        if kind == "allreduce":
            show(bench_allreduce(cluster, max_bytes=args.max_bytes, iters=args.iters))
        else:
            show(bench_scaling(cluster, steps=args.steps))

    def _cmd_list(self, args: argparse.Namespace) -> None:
        self._no_extra(args)
        manager = get_manager()
        clusters = manager.list()
        current = manager.current
        for c in clusters:
            mark = "*" if c is current else " "
            detached = "  detached" if isinstance(c, DetachedCluster) else ""
            print(
                f"{mark} {c.name:<16} {c.kind:<8} {c.world_size} workers  {c.backend or '-':<5} {c.state}{detached}"
            )
        ours = {c.name for c in clusters}
        for rec in detached_records():
            if rec["name"] not in ours:
                print(
                    f"  {rec['name']:<16} local    detached, not attached in this kernel (%gpu_cluster attach "
                    f"{rec['name']})"
                )
        others = [st for st in _saved_cloud_states() if st.name not in ours]
        for st in others:
            print(
                f"  {st.name:<16} cloud:{st.cloud:<6} {st.region or '-':<12} {st.status}  "
                f"(started by an earlier kernel; %gpu_cluster stop {st.name} tears it down)"
            )
        if not clusters and not others and not detached_records():
            print("no clusters in this kernel; start one with %gpu_cluster start")

    def _cmd_attach(self, args: argparse.Namespace) -> None:
        attach(
            args,
            self.shell.user_ns if self.shell is not None else {},
            getattr(self.shell, "kernel", None) is not None,
        )

    def _cmd_use(self, args: argparse.Namespace) -> None:
        if len(args.args) != 1:
            raise UsageError("use takes one argument: the cluster's name (see %gpu_cluster list)")
        c = get_manager().use(args.args[0])
        print(f"current cluster: {c.name!r} ({c.world_size} workers)")

    def _cmd_workshop(self, args: argparse.Namespace) -> None:
        workshop(args)

    def _cmd_students(self, args: argparse.Namespace) -> None:
        students(args)

    def _cmd_env(self, args: argparse.Namespace) -> None:
        """Each rank's effective settings (torchrun variables, NCCL_*, --env names...), secrets as ****."""
        show(rank_env(self._pick(args)))

    def _cmd_logs(self, args: argparse.Namespace) -> None:
        cluster = self._pick(args)
        with usage_errors(ValueError):  # logs' own checks: --rank 99 of a 2-rank cluster, --tail 0
            logs = cluster.logs(rank=args.rank, tail=args.tail)
        if not any(logs.values()):
            print("no output recorded yet")
        for rank, lines in logs.items():
            for line in lines:
                print(f"[rank {rank}] {line}")

    def _cmd_stacks(self, args: argparse.Namespace) -> None:
        """Each rank's Python stack of every thread (also while a cell runs): where is each rank?"""
        print(self._pick(args).stacks(native=args.native))

    def _pick(self, args: argparse.Namespace, instead: str = "") -> Any:
        if args.args:
            if len(args.args) > 1:
                raise UsageError(f"{args.command} takes at most one cluster name")
            return get_manager().get(args.args[0])
        return get_manager().require_current(instead)


def _saved_cloud_states() -> list[Any]:
    """The cloud clusters an earlier kernel started and did not tear down (their saved state)."""
    return list(active_states())


def _saved_cloud(name: str) -> bool:
    return any(st.name == name for st in _saved_cloud_states())
