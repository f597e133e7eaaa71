"""The dependency internals gristmill leans on (gristmill.compat) are there, in the versions the
compat modules were written for. A failure here means: an upgrade; re-read the private code
named in the module's docstring before extending its WRITTEN_FOR."""

from __future__ import annotations

import importlib.metadata
import io

import pytest


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def test_torch_internals():
    torch = pytest.importorskip("torch")
    from gristmill.compat import torch as compat

    assert _major_minor(torch.__version__) in compat.WRITTEN_FOR, (
        f"torch {torch.__version__} installed; gristmill.compat.torch was written for {compat.WRITTEN_FOR}"
    )
    t = torch.ones(3)
    assert compat.local_tensor(t) is t and not compat.is_dtensor(t)
    steps = [torch.zeros(()), torch.zeros(())]
    compat.foreach_add_(steps, 1)
    compat.foreach_sub_(steps, [torch.tensor(1.0), torch.tensor(0.0)])
    assert [float(s) for s in steps] == [0.0, 1.0]
    assert float(torch.stack(compat.foreach_norm([torch.tensor([3.0, 4.0])])).sum()) == 5.0
    assert len(compat.attention_ops()) == 3
    wrapped = compat.checkpoint_wrapper(torch.nn.Linear(2, 2), preserve_rng_state=False)
    assert wrapped(torch.ones(1, 2)).shape == (1, 2)
    # the fused AdamW kernel torch.optim.AdamW(fused=True) calls: one step against the optimizer
    p0 = torch.tensor([1.0, -2.0])
    g = torch.tensor([0.5, 0.25])
    ref = torch.nn.Parameter(p0.clone())
    ref.grad = g.clone()
    opt = torch.optim.AdamW([ref], lr=0.1, weight_decay=0.01, foreach=False)
    opt.step()
    p, m, v, step = p0.clone(), torch.zeros(2), torch.zeros(2), torch.zeros(())
    compat.foreach_add_([step], 1)
    try:
        compat.fused_adamw_(
            [p],
            [g.clone()],
            [m],
            [v],
            [step],
            lr=0.1,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.01,
            eps=1e-8,
            grad_scale=None,
            found_inf=None,
        )
    except RuntimeError as e:  # some CPU builds have no fused CPU kernel
        pytest.skip(f"no fused AdamW kernel on this device: {e}")
    assert torch.allclose(p, ref.detach(), atol=1e-6)


def test_datatrove_internals():
    import inspect

    import datatrove
    import datatrove.executor.base as dt_base

    from gristmill.compat import datatrove as compat

    version = importlib.metadata.version("datatrove")
    assert version in compat.WRITTEN_FOR, (
        f"datatrove {version} installed; gristmill.compat.datatrove was written for {compat.WRITTEN_FOR}"
    )
    assert datatrove.__name__ == "datatrove"
    # the two module functions replaced in each task's process, with the signatures called
    for name in ("add_task_logger", "close_task_logger"):
        assert callable(getattr(dt_base, name)), name
    assert list(inspect.signature(dt_base.add_task_logger).parameters)[:4] == [
        "logging_dir",
        "rank",
        "local_rank",
        "node_rank",
    ]
    # the per-rank entry the local supervisor calls and both executors override
    params = list(inspect.signature(dt_base.PipelineExecutor._run_for_rank).parameters)
    assert params[:4] == ["self", "rank", "local_rank", "node_rank"], params


def test_ray_internals():
    import inspect
    import socket

    ray = pytest.importorskip("ray")
    from ray._private import node, services
    from ray._private.authentication import authentication_token_setup as setup

    from gristmill.compat import ray as compat

    assert _major_minor(ray.__version__) in compat.WRITTEN_FOR, (
        f"ray {ray.__version__} installed; gristmill.compat.ray was written for {compat.WRITTEN_FOR}"
    )
    # the address lookup ray.init does, on its own: an explicit host:port stays one
    host, _, port = services.canonicalize_bootstrap_address_or_die("127.0.0.1:6379").rpartition(":")
    assert host and port == "6379"
    # the connect window is read from this variable, a retry a second
    assert compat.GCS_WAIT_ENV in inspect.getsource(node.Node._init_gcs_client)
    assert setup.AUTH_MODE_ENV_VAR == "RAY_AUTH_MODE"
    assert list(inspect.signature(setup.maybe_enable_token_auth_if_token_available).parameters) == ["warn_if_disabled"]
    assert callable(setup._enable_token_auth)
    # nothing listens on a port just freed: refused at once, in one line
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(compat.Unreachable, match=f"cannot reach 127.0.0.1:{free}"):
        compat.check_reachable(f"127.0.0.1:{free}", 2.0)


def test_botocore_internals():
    botocore = pytest.importorskip("botocore")
    from botocore.response import StreamingBody

    from gristmill.compat import botocore as compat

    assert _major_minor(botocore.__version__) in compat.WRITTEN_FOR, (
        f"botocore {botocore.__version__} installed; gristmill.compat.botocore was written for {compat.WRITTEN_FOR}"
    )
    # a GetObject body wraps a urllib3 response whose read1 hands on what has arrived
    from urllib3.response import HTTPResponse

    raw = HTTPResponse(io.BytesIO(b"abcdef"), preload_content=False)
    body = StreamingBody(raw, 6)
    assert body._raw_stream is raw and callable(raw.read1)
    assert compat.read_arrived(body, 4) == b"abcd" and compat.read_arrived(body, 4) == b"ef"
    assert compat.read_arrived(body, 4) == b""
