"""A start the cluster can never hold fails at once; one that waits for what others hold says who holds it.

On the session's local Ray (8 logical CPUs, which cannot grow), ``%gpu_cluster start --workers 99`` waited the
whole placement timeout (120 s) before saying it could never fit. The timeouts below are far under that wait.
"""

from __future__ import annotations

import pytest

from gpu_notebook import Cluster, get_manager
from gpu_notebook.distributed import GroupError, GroupTimeouts
from gpu_notebook.distributed._placement import cluster_can_grow, never_fits


@pytest.mark.timeout(60)
def test_more_workers_than_the_cluster_has_fail_at_once_naming_what_fits(ip, ray_session, capsys) -> None:
    assert not cluster_can_grow()  # a local Ray: Ray's read-only autoscaler, no node can be added
    capsys.readouterr()
    res = ip.run_cell("%gpu_cluster start --name toomany --workers 99 --cpus-per-worker 1")
    assert isinstance(res.error_in_exec, GroupError)  # the cell fails: Run All stops here
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert "99 workers x 1 CPU need 99 CPU; this cluster has 8 CPU in all (1 node) and cannot grow" in shown
    assert "use --workers 8 or --cpus-per-worker 0.08" in shown
    assert "could not place" not in shown  # it did not wait for the placement timeout
    assert get_manager().get("toomany", None) is None


@pytest.mark.timeout(60)
def test_scaling_beyond_the_cluster_fails_at_once_and_keeps_the_workers(ip, shared) -> None:
    with pytest.raises(GroupError, match="cannot grow: use --workers 16 or --cpus-per-worker 0.08"):
        shared.scale(99)  # 99 x 0.5 CPU
    assert shared.running and shared.world_size == 2
    assert shared.call(lambda: 1) == [1, 1]  # the workers it had are still there


@pytest.mark.timeout(90)
def test_a_start_that_waits_for_cpus_someone_holds_names_the_holder(ray_session) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    # another notebook's cluster on the same Ray: it holds every CPU but a quarter
    free = ray.available_resources().get("CPU", 0)
    assert free > 1.0
    holder = placement_group([{"CPU": free - 0.25}], name="another-notebooks-workers")
    ray.get(holder.ready(), timeout=30)
    try:
        c = Cluster(name="waits", workers=2, cpus_per_worker=0.5, timeouts=GroupTimeouts(placement=2))
        lines: list[str] = []
        with pytest.raises(GroupError) as err:
            c.start(progress=lines.append)
    finally:
        remove_placement_group(holder)
    msg = str(err.value)
    assert msg.startswith("could not place 2 worker(s) of 0.5 CPU each within 2 s")
    assert f"placement group 'another-notebooks-workers' holds {free - 0.25:g} CPU" in msg
    assert "cannot grow" not in msg  # it fits the cluster: it waited for the deadline
    assert get_manager().get("waits", None) is None


@pytest.mark.parametrize(
    "size,bundle,nodes,says",
    [
        # a bundle never straddles two nodes: 3 workers of 1.5 CPU do not fit two 2-CPU nodes
        (3, {"CPU": 1.5}, [{"CPU": 2}, {"CPU": 2}], "use --workers 2 or --cpus-per-worker 1"),
        (4, {"CPU": 1, "GPU": 1}, [{"CPU": 8, "GPU": 2}], "use --workers 2 or --gpus-per-worker 0.5"),
        (2, {"CPU": 1, "GPU": 1}, [{"CPU": 8}], "need 2 CPU, 2 GPU; this cluster has 8 CPU, 0 GPU in all"),
    ],
)
def test_never_fits_names_what_would(size, bundle, nodes, says) -> None:
    msg = never_fits(size, bundle, nodes)
    assert msg is not None and says in msg, msg
    assert never_fits(1, {"CPU": 1}, [{"CPU": 2}]) is None
