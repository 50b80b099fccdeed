"""GRPO's dynamic micro-batching on 2 gloo processes (127.0.0.1) equals VERL's: each rank's response weights to
1e-6 relative, and every rank runs VERL's MAX over the ranks of the micro-batch count (rank 1's rollouts are 3x
shorter, so its own count is smaller). The probe and VERL's side: tests/helpers/dynamic_batching_probe.py."""

import socket

import torch.multiprocessing as mp

from tests.helpers.dynamic_batching_probe import gloo_worker


def test_response_weights_equal_verl_on_two_gloo_processes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(gloo_worker, args=(port, queue), nprocs=2, start_method="spawn", join=True)
    by_rank = dict((rank, (results, local)) for rank, results, local in (queue.get(), queue.get()))
    for rank in (0, 1):
        results, _ = by_rank[rank]
        assert max(r["relative"] for r in results) < 1e-6
    for step in range(4):
        counts = {by_rank[rank][0][step]["count"] for rank in (0, 1)}
        local = [by_rank[rank][1][step] for rank in (0, 1)]
        assert counts == {max(local)} and by_rank[0][0][step]["ours_count"] == max(local)
    assert any(by_rank[1][1][step] < by_rank[0][1][step] for step in range(4))  # the MAX changed rank 1's cut
