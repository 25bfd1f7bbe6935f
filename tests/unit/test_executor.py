"""The executor alone (no DeepSpeed): results equal torch's AdamW, stages are ordered, bytes are counted."""

from __future__ import annotations

import pytest
import torch

from lightning_dos.planning.perf_model import CostParams, device_memory_bytes
from lightning_dos.planning.plan import Lane, Plan
from lightning_dos.update.executor import UpdateExecutor
from lightning_dos.update.subgroup import AdamHyper, Subgroup

HYPER = AdamHyper(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, adamw=True)
SIZES = [300, 120, 500, 80, 260]


class _Clock:
    """The update modules' ``time.perf_counter``, moved by the test: each reading ``tick`` s after the one before, and
    what runs between two points of the test takes the time :meth:`advance` says. Spans and leads are then exact, and
    their order is the order the code ran in, whatever the machine's speed."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 1000.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """A ticking clock (1 ms a reading) for every update module that reads the time."""
    from lightning_dos.update import device_lane, executor, host_lane, streams

    fake = _Clock(tick=1e-3)
    for module in (device_lane, executor, host_lane, streams):
        monkeypatch.setattr(module, "time", fake)
    return fake


def _subgroups(param_dtype: torch.dtype = torch.float32) -> list[Subgroup]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, n in enumerate(SIZES):
        master = torch.randn(n, generator=g)
        out.append(
            Subgroup(
                index=i,
                numel=n,
                master=master,
                exp_avg=torch.randn(n, generator=g).abs() * 1e-2,
                exp_avg_sq=torch.randn(n, generator=g).abs() * 1e-3,
                state={"step": 3},
                grad=torch.randn(n, generator=g),
                param16=master.to(param_dtype),
                hyper=HYPER,
            )
        )
    return out


def _reference(sg: Subgroup, inv: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.optim.AdamW (single-tensor, not fused) from the same state."""
    p = torch.nn.Parameter(sg.master.clone())
    opt = torch.optim.AdamW([p], lr=HYPER.lr, betas=(HYPER.beta1, HYPER.beta2), eps=HYPER.eps,
                            weight_decay=HYPER.weight_decay, foreach=False)
    opt.state[p] = {"step": torch.tensor(float(sg.state["step"])), "exp_avg": sg.exp_avg.clone(),
                    "exp_avg_sq": sg.exp_avg_sq.clone()}
    p.grad = sg.grad.clone() * inv
    opt.step()
    return p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]


def _host_step_with_torch(subgroups: list[Subgroup], inv: float):
    def host_step(i: int) -> None:
        sg = subgroups[i]
        m, a, v = _reference(sg, inv)
        sg.master.copy_(m)
        sg.exp_avg.copy_(a)
        sg.exp_avg_sq.copy_(v)
        sg.state["step"] += 1

    return host_step


def _host_step_with_cpu_adam(subgroups: list[Subgroup], inv: float):
    """The host lane's real step: DeepSpeed's CPU Adam through the GIL-free op (what the seam gives the executor),
    the gradient scaled by ``inv`` as the kernel reads it."""
    from lightning_dos.zero.cpu_adam_nogil import HostAdam

    adam = HostAdam({"lr": HYPER.lr, "betas": (HYPER.beta1, HYPER.beta2), "eps": HYPER.eps,
                     "weight_decay": HYPER.weight_decay}, adamw=HYPER.adamw)

    def host_step(i: int) -> None:
        sg = subgroups[i]
        adam.step(sg.state, sg.master, sg.grad, sg.hyper, grad_scale=inv)

    return host_step


@pytest.mark.parametrize(("lanes", "buffers"), [("HDHDD", 1), ("HDHDD", 2), ("HDHDD", 3), ("DDDDD", 1), ("DDDDD", 2),
                                                ("DDDDD", 3), ("HHHHH", 1)])  # no device lane: buffers change nothing
def test_both_lanes_match_torch_adamw(lanes: str, buffers: int, clock: _Clock) -> None:
    """Each lane's real update, DeepSpeed's CPU Adam on the host and fused Adam on the device, against torch's AdamW
    from the same state."""
    inv = 0.5
    subgroups = _subgroups(torch.bfloat16)
    for sg in subgroups:
        sg.state.update(exp_avg=sg.exp_avg, exp_avg_sq=sg.exp_avg_sq)  # CPU Adam reads the moments from its state
    expected = [_reference(sg, inv) for sg in subgroups]
    plan = [Lane.DEVICE if c == "D" else Lane.HOST for c in lanes]
    order = [4, 0, 1, 2, 3]  # a device-lane order other than ascending
    before = clock.now
    timings = UpdateExecutor(torch.device("cpu")).run(
        plan, order, buffers, subgroups, torch.tensor(inv), _host_step_with_cpu_adam(subgroups, inv)
    )
    assert before < timings.started_s < timings.started_s + timings.total_s <= clock.now  # when it began: host clock
    for sg, (m, a, v), lane in zip(subgroups, expected, lanes):
        # CPU Adam's vectorised fp32 (fused multiply-adds) differs from torch's loop in the last bits of the moments
        scale = 10 if lane == "H" else 1
        torch.testing.assert_close(sg.master, m, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(sg.exp_avg, a, rtol=1e-6, atol=1e-9 * scale)
        torch.testing.assert_close(sg.exp_avg_sq, v, rtol=1e-6, atol=1e-10 * scale)
        assert sg.state["step"] == 4
        # 16-bit params written in their own dtype, from the updated master
        assert sg.param16.dtype == torch.bfloat16
        assert torch.equal(sg.param16, sg.master.to(torch.bfloat16))
    n_dev = sum(n for n, c in zip(SIZES, lanes) if c == "D")
    n_host = sum(SIZES) - n_dev
    assert timings.device_params == n_dev and timings.host_params == n_host
    assert timings.h2d_bytes == 16 * n_dev and timings.d2h_bytes == 12 * n_dev
    assert timings.upload_bytes == 4 * n_host  # fp32 master; the 16-bit params are written on the device
    assert len(timings.events) == len(SIZES)


def test_host_lane_runs_in_the_plans_host_order() -> None:
    """The host lane takes its subgroups in ``host_order`` (then any it left out, ascending); the update is the
    same whatever the order."""
    subgroups = _subgroups(torch.bfloat16)
    expected = [_reference(sg, 0.5) for sg in subgroups]
    reference_step = _host_step_with_torch(subgroups, 0.5)
    ran: list[int] = []

    def host_step(i: int) -> None:
        ran.append(i)
        reference_step(i)

    lanes = [Lane.HOST, Lane.DEVICE, Lane.HOST, Lane.HOST, Lane.HOST]
    UpdateExecutor(torch.device("cpu")).run(lanes, [1], 2, subgroups, torch.tensor(0.5), host_step,
                                            host_order=[2, 4])
    assert ran == [2, 4, 0, 3]
    for sg, (m, _, _) in zip(subgroups, expected):
        torch.testing.assert_close(sg.master, m, rtol=1e-6, atol=1e-7)


def test_a_16_bit_gradient_kept_on_the_device_is_widened_exactly() -> None:
    """A gradient kept on the device in bf16 is widened into the slot: the same update as its fp32 copy on the host,
    bit for bit, and nothing of it crosses the link (12 bytes/param prefetched)."""
    kept, via_host = _subgroups(torch.bfloat16), _subgroups(torch.bfloat16)
    for a, b in zip(kept, via_host):
        a.grad = a.grad.to(torch.bfloat16)
        a.grad_on_device = True
        b.grad = a.grad.float()
    lanes = [Lane.DEVICE] * len(SIZES)
    timings = [UpdateExecutor(torch.device("cpu")).run(lanes, [], 2, sgs, torch.tensor(0.5), lambda i: None)
               for sgs in (kept, via_host)]
    for a, b in zip(kept, via_host):
        assert torch.equal(a.master, b.master) and torch.equal(a.exp_avg_sq, b.exp_avg_sq)
        assert a.grad.dtype == torch.bfloat16  # the kept gradient itself is left as it was
    assert [t.h2d_bytes for t in timings] == [12 * sum(SIZES), 16 * sum(SIZES)]
    # every gradient kept on the device: slots of 3 rows, the 16-bit ones widened through a scratch chunk
    scratch = max(SIZES)  # fp32 elements: the largest subgroup, below the chunk
    slots, with_row = 2 * 3 * max(SIZES) * 4, 2 * 4 * max(SIZES) * 4
    assert [t.device_buffer_bytes for t in timings] == [slots + 4 * scratch, with_row]


def test_a_16_bit_gradient_widened_in_chunks_is_the_same_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 64 elements (a multiple of the vector width, as the real chunk is): the values of one whole pass."""
    import lightning_dos.update.device_adam as device_adam

    runs = []
    for chunk in (device_adam.CHUNK, 64):
        monkeypatch.setattr(device_adam, "CHUNK", chunk)
        sgs = _subgroups(torch.bfloat16)
        for sg in sgs:
            sg.grad, sg.grad_on_device = sg.grad.to(torch.bfloat16), True
        UpdateExecutor(torch.device("cpu")).run([Lane.DEVICE] * len(SIZES), [], 2, sgs, 0.5, lambda i: None)
        runs.append(sgs)
    for a, b in zip(*runs):
        assert torch.equal(a.master, b.master) and torch.equal(a.exp_avg, b.exp_avg)
        assert torch.equal(a.exp_avg_sq, b.exp_avg_sq) and torch.equal(a.param16, b.param16)


@pytest.mark.parametrize("grads", ["kept bf16", "kept fp32", "host"])
def test_subgroups_pass_through_the_slots_in_pieces_with_the_values_of_whole_subgroups(
        grads: str, monkeypatch: pytest.MonkeyPatch, clock: _Clock) -> None:
    """Pieces of 128 parameters (a multiple of every vector width, as the real piece is) through slots of one piece:
    the values of whole subgroups bit for bit, early prefetches included, the same bytes on the link, slots of a
    piece instead of the largest subgroup, and one span per stage of each subgroup covering all its pieces."""
    import lightning_dos.update.device_lane as device_lane

    def subgroups() -> list[Subgroup]:
        sgs = _subgroups(torch.bfloat16)
        for sg in sgs:
            if grads != "host":
                sg.grad = sg.grad.to(torch.bfloat16 if grads == "kept bf16" else torch.float32)
                sg.grad_on_device = True
        return sgs

    lanes = [Lane.DEVICE] * len(SIZES)
    order = [2, 0, 4, 1, 3]
    whole = subgroups()
    first = UpdateExecutor(torch.device("cpu")).run(lanes, order, 2, whole, torch.tensor(0.5), lambda i: None)
    monkeypatch.setattr(device_lane, "PIECE", 128)
    pieces = subgroups()
    runner = UpdateExecutor(torch.device("cpu"))
    assert runner.prefetch_ahead(lanes, order, 2, pieces) == 2  # two pieces of subgroup 2 (500 parameters)
    timings = runner.run(lanes, order, 2, pieces, torch.tensor(0.5), lambda i: None)
    assert timings.prefetched_ahead == 2
    for a, b in zip(whole, pieces):
        assert torch.equal(a.master, b.master) and torch.equal(a.exp_avg, b.exp_avg)
        assert torch.equal(a.exp_avg_sq, b.exp_avg_sq) and torch.equal(a.param16, b.param16)
        assert a.state["step"] == b.state["step"] == 4
    assert (timings.h2d_bytes, timings.d2h_bytes) == (first.h2d_bytes, first.d2h_bytes)
    rows = 4 if grads == "host" else 3  # a gradient row only for gradients on the host; else a scratch chunk
    scratch = 0 if grads == "host" else 4 * 128
    assert first.device_buffer_bytes == 2 * rows * max(SIZES) * 4 + (4 * max(SIZES) if scratch else 0)
    assert timings.device_buffer_bytes == 2 * rows * 128 * 4 + scratch
    # the planner weighs the slots that run (a piece each, at 16 bytes per parameter): never less than the lane takes
    weighed = device_memory_bytes(Plan(lanes=tuple(lanes), device_order=tuple(order)), SIZES,
                                  CostParams(slot_params=128))
    assert timings.device_buffer_bytes <= weighed == 2 * 128 * 16
    assert sorted(e["subgroup"] for e in timings.events) == list(range(len(SIZES)))
    big = next(e for e in timings.events if e["subgroup"] == 2)  # 4 pieces: the first prefetched before the phase
    assert big["prefetch"][0] < 0 <= big["adam"][0] < big["prefetch"][1] <= big["flush"][1]
    assert 0 < timings.prefetch_busy_s <= timings.device_busy_s + max(0.0, -big["prefetch"][0])


def test_device_lane_stages_are_ordered_by_slot(clock: _Clock) -> None:
    """prefetch -> adam -> flush per subgroup; with one slot, a prefetch starts after the previous flush."""
    subgroups = _subgroups()
    timings = UpdateExecutor(torch.device("cpu")).run(
        [Lane.DEVICE] * len(SIZES), list(range(len(SIZES))), 1, subgroups, 1.0, lambda i: None
    )
    spans = {e["subgroup"]: e for e in timings.events}
    for i in range(len(SIZES)):
        e = spans[i]
        assert e["prefetch"][1] <= e["adam"][0] <= e["adam"][1] <= e["flush"][0]
        if i:
            assert spans[i - 1]["flush"][1] <= e["prefetch"][0]
    assert timings.prefetch_busy_s > 0 and timings.adam_busy_s > 0 and timings.flush_busy_s > 0
    assert timings.device_busy_s >= timings.adam_busy_s


def test_plan_length_must_match() -> None:
    with pytest.raises(ValueError, match="lanes"):
        UpdateExecutor(torch.device("cpu")).run([Lane.HOST], [0], 2, _subgroups(), 1.0, lambda i: None)


def test_chunked_transfers_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefetch and flush in chunks (64 MB on a real run; 7 elements here) move every element exactly once."""
    import lightning_dos.update.streams as streams

    monkeypatch.setattr(streams, "COPY_CHUNK", 7)  # the device lane's copies
    inv = 0.25
    subgroups = _subgroups()
    expected = [_reference(sg, inv) for sg in subgroups]
    UpdateExecutor(torch.device("cpu")).run(
        [Lane.DEVICE] * len(SIZES), list(range(len(SIZES))), 2, subgroups, inv, lambda i: None
    )
    for sg, (m, a, v) in zip(subgroups, expected):
        torch.testing.assert_close(sg.master, m, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(sg.exp_avg, a, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(sg.exp_avg_sq, v, rtol=1e-6, atol=1e-10)


def test_device_lane_is_issued_a_window_ahead_of_the_host_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """Device-lane subgroups are issued between host-lane subgroups, at most PREFETCH_WINDOW prefetches ahead.

    Events here complete only once the host lane has finished one more subgroup after they were recorded,
    like a prefetch that is still on the link while CPU Adam runs; results must not change.
    """
    import lightning_dos.update.device_lane as device_lane
    import lightning_dos.update.streams as streams
    from lightning_dos.planning.perf_model import PREFETCH_WINDOW

    clock = {"host_steps": 0}
    log: list[str] = []

    class SlowEvent(streams.HostEvent):
        def record(self, stream: object = None) -> None:
            super().record(stream)
            self.at = clock["host_steps"]

        def query(self) -> bool:
            return clock["host_steps"] > self.at

    monkeypatch.setattr(streams.Streams, "event", lambda self, timing=False: SlowEvent())
    issue_next = device_lane.DeviceLane.issue_next

    def logged_issue(lane: device_lane.DeviceLane) -> None:
        log.append(f"D{lane.ids[lane.next]}")
        issue_next(lane)

    monkeypatch.setattr(device_lane.DeviceLane, "issue_next", logged_issue)
    sizes = [50] * 8
    g = torch.Generator().manual_seed(1)
    subgroups = [
        Subgroup(index=i, numel=n, master=torch.randn(n, generator=g), exp_avg=torch.zeros(n),
                 exp_avg_sq=torch.zeros(n), state={"step": 0}, grad=torch.randn(n, generator=g),
                 param16=torch.zeros(n), hyper=HYPER)
        for i, n in enumerate(sizes)
    ]
    expected = [_reference(sg, 1.0) for sg in subgroups]
    reference_step = _host_step_with_torch(subgroups, 1.0)

    def host_step(i: int) -> None:
        log.append(f"H{i}")
        reference_step(i)
        clock["host_steps"] += 1

    lanes = [Lane.HOST, Lane.HOST, Lane.HOST] + [Lane.DEVICE] * 5
    UpdateExecutor(torch.device("cpu")).run(lanes, list(range(8)), 3, subgroups, 1.0, host_step)
    window = PREFETCH_WINDOW
    assert log[:window] == [f"D{3 + j}" for j in range(window)]  # the first prefetches go out before CPU Adam
    assert log[window] == "H0"
    assert log.index("D7") > log.index("H0")  # not everything up front: the rest follows the host lane
    assert sorted(log) == sorted([f"H{i}" for i in range(3)] + [f"D{i}" for i in range(3, 8)])
    for sg, (m, a, v) in zip(subgroups, expected):
        torch.testing.assert_close(sg.master, m, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(sg.exp_avg, a, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(sg.exp_avg_sq, v, rtol=1e-6, atol=1e-10)


def test_host_lane_uploads_pass_through_the_ring_in_chunks_and_never_block_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Uploads that land only once something waits for them, and a 7-element chunk: the host lane issues every
    upload and goes straight on; the first wait comes after the last upload was issued (``run`` waiting for it before
    it returns).

    Every chunk of every host subgroup goes through the ring of ``UPLOAD_BUFFERS`` device buffers (chunk k into
    buffer k mod 3), and the params come out bit-identical to the updated master in their own dtype.
    """
    import lightning_dos.update.host_lane as host_lane
    import lightning_dos.update.streams as streams

    copies: list[tuple[int, int]] = []
    ends: list[InFlightEvent] = []  # each upload's last event
    waits: list[int] = []  # per wait for an event: how many subgroups' uploads had been issued by then

    class InFlightEvent(streams.HostEvent):
        """An upload still on the link: it lands when something waits for it, not before."""

        landed = False

        def query(self) -> bool:
            return self.landed

        def synchronize(self) -> None:
            waits.append(len(copies))
            self.landed = True

    monkeypatch.setattr(streams.Streams, "event", lambda self, timing=False: InFlightEvent())
    monkeypatch.setattr(host_lane, "COPY_CHUNK", 7)  # the upload ring's buffers
    ring_upload = host_lane._UploadRing.upload

    def logged_upload(ring: host_lane._UploadRing, master: torch.Tensor, param16: torch.Tensor):
        first = ring.next
        begin, end = ring_upload(ring, master, param16)
        copies.append((first, ring.next))
        ends.append(end)
        return begin, end

    monkeypatch.setattr(host_lane._UploadRing, "upload", logged_upload)
    subgroups = _subgroups(torch.bfloat16)
    expected = [_reference(sg, 1.0) for sg in subgroups]
    run = UpdateExecutor(torch.device("cpu"))
    timings = run.run(
        [Lane.HOST] * len(SIZES), list(range(len(SIZES))), 1, subgroups, 1.0, _host_step_with_torch(subgroups, 1.0)
    )
    assert [last - first for first, last in copies] == [-(-n // 7) for n in SIZES]  # ceil(n / 7) chunks each
    ring = run.host_lane.buffers
    assert all(b.numel() == 7 for b in ring) and len(ring) == host_lane.UPLOAD_BUFFERS
    assert timings.device_buffer_bytes == host_lane.UPLOAD_BUFFERS * 7 * 4
    assert waits and waits[0] == len(SIZES)  # no upload was waited for while the host lane ran ...
    assert ends[-1].landed  # ... but run() returns only once the last one has landed
    for sg, (m, _, _) in zip(subgroups, expected):
        torch.testing.assert_close(sg.master, m, rtol=1e-6, atol=1e-7)
        assert torch.equal(sg.param16, sg.master.to(torch.bfloat16))
    assert timings.upload_bytes == 4 * sum(SIZES)


def test_upload_ring_reuses_a_buffer_only_after_its_last_conversion() -> None:
    """Stream order of the ring, read from a log: chunk k waits (on ``h2d``) for the conversion of chunk k - 3."""
    import contextlib
    import itertools

    import lightning_dos.update.host_lane as host_lane

    counter = itertools.count()
    log: list[tuple[str, str, int]] = []

    class Streams:
        h2d, convert = "h2d", "convert"

        def use(self, stream: str) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext()

        def record(self, stream: str, timing: bool = False) -> int:
            event = next(counter)
            log.append(("record", stream, event))
            return event

        def wait(self, stream: str, event: int | None) -> None:
            if event is not None:
                log.append(("wait", stream, event))

    buffers = [torch.empty(4) for _ in range(3)]
    ring = host_lane._UploadRing(Streams(), buffers)  # type: ignore[arg-type]
    master = torch.arange(22, dtype=torch.float32)  # 6 chunks of 4 (the last of 2)
    param16 = torch.zeros(22, dtype=torch.bfloat16)
    begin, end = ring.upload(master, param16)
    assert torch.equal(param16, master.to(torch.bfloat16))
    conversions = [e for kind, stream, e in log if kind == "record" and stream == "convert"]
    assert len(conversions) == 6 and end == conversions[-1]
    h2d_waits = [e for kind, stream, e in log if kind == "wait" and stream == "h2d"]
    assert h2d_waits == conversions[:3]  # chunks 3, 4, 5 wait for chunks 0, 1, 2 (same buffer)
    # and each conversion waits for its own copy, recorded on h2d just before
    copies = [e for kind, stream, e in log if kind == "record" and stream == "h2d" and e != begin]
    assert [e for kind, stream, e in log if kind == "wait" and stream == "convert"] == copies


def test_prefetches_issued_before_the_update_phase_are_used_and_give_the_same_result(clock: _Clock) -> None:
    """``prefetch_ahead`` (the manager calls it at dispatch) issues the device lane's first prefetches, one per slot
    and at most PREFETCH_WINDOW; the next ``run`` of that plan uses them, and the result is torch's AdamW."""
    from lightning_dos.planning.perf_model import PREFETCH_WINDOW

    inv = 0.5
    subgroups = _subgroups()
    expected = [_reference(sg, inv) for sg in subgroups]
    lanes = [Lane.DEVICE if c == "D" else Lane.HOST for c in "DHDDD"]
    executor = UpdateExecutor(torch.device("cpu"))
    clock.tick = 0.0  # the clock stands still but for what the test says
    assert executor.prefetch_ahead(lanes, [3, 0, 2, 4], 3, subgroups) == min(PREFETCH_WINDOW, 3) == 2
    clock.advance(0.02)  # what runs between dispatch and the update phase (overflow check, gradient norm)
    timings = executor.run(lanes, [3, 0, 2, 4], 3, subgroups, torch.tensor(inv), _host_step_with_torch(subgroups, inv))
    assert timings.prefetched_ahead == 2
    assert timings.lead_s == pytest.approx(0.02)  # the head start the model's dispatch_lead_s learns
    for sg, (m, a, v) in zip(subgroups, expected):
        torch.testing.assert_close(sg.master, m, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(sg.exp_avg, a, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(sg.exp_avg_sq, v, rtol=1e-6, atol=1e-10)
    spans = {e["subgroup"]: e for e in timings.events if e["lane"] == "device"}
    assert spans[3]["prefetch"][0] == spans[0]["prefetch"][0] == pytest.approx(-0.02)  # issued at dispatch
    assert spans[2]["prefetch"][0] >= 0 and spans[3]["prefetch"][1] <= spans[3]["adam"][0]
    assert timings.h2d_bytes == 16 * sum(SIZES[i] for i in (0, 2, 3, 4))  # every prefetch counted once


@pytest.mark.parametrize("change", ["plan", "buffers", "tensor"])
def test_early_prefetches_of_another_plan_or_other_tensors_are_dropped(change: str) -> None:
    """A run whose plan, slots or tensors differ from what was prefetched ahead does not use those copies."""
    inv = 1.0
    subgroups = _subgroups()
    lanes = [Lane.DEVICE if c == "D" else Lane.HOST for c in "DHDDD"]
    executor = UpdateExecutor(torch.device("cpu"))
    executor.prefetch_ahead(lanes, [0, 2, 3, 4], 2, subgroups)
    buffers = 2
    if change == "plan":
        lanes = [Lane.DEVICE if c == "D" else Lane.HOST for c in "HDDDD"]
    elif change == "buffers":
        buffers = 3
    else:  # e.g. a checkpoint loaded since: the moments live in new tensors, with other values
        subgroups[0].exp_avg = subgroups[0].exp_avg.clone().mul_(2.0)
    expected = [_reference(sg, inv) for sg in subgroups]
    timings = executor.run(lanes, [0, 1, 2, 3, 4], buffers, subgroups, inv, _host_step_with_torch(subgroups, inv))
    assert timings.prefetched_ahead == 0 and timings.lead_s == 0.0
    for sg, (m, a, _v) in zip(subgroups, expected):
        torch.testing.assert_close(sg.master, m, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(sg.exp_avg, a, rtol=1e-6, atol=1e-9)


def test_discarded_early_prefetches_leave_the_state_alone() -> None:
    subgroups = _subgroups()
    before = [sg.master.clone() for sg in subgroups]
    executor = UpdateExecutor(torch.device("cpu"))
    executor.prefetch_ahead([Lane.DEVICE] * len(SIZES), list(range(len(SIZES))), 2, subgroups)
    executor.discard_ahead()
    assert executor.prefetch_ahead([Lane.HOST] * len(SIZES), [], 2, subgroups) == 0
    assert all(torch.equal(a, sg.master) for a, sg in zip(before, subgroups))


class _ForwardOnlyEvent:
    """A device event whose ``elapsed_time`` refuses to measure backwards in time."""

    def __init__(self, t: float) -> None:
        self.t = t

    def elapsed_time(self, other: _ForwardOnlyEvent) -> float:
        assert other.t >= self.t, "measured backwards"
        return (other.t - self.t) * 1e3


def test_spans_of_early_prefetches_are_timed_forward_from_the_lane_origin() -> None:
    """On a GPU a prefetch issued at dispatch begins before the phase's start event: its span is measured from the
    lane's origin event (recorded before it) and shifted, never as an elapsed time that runs backwards."""
    from lightning_dos.update.timings import LaneTimings, resolve_spans

    origin, start = _ForwardOnlyEvent(0.0), _ForwardOnlyEvent(0.020)
    spans = [(0, "device", "prefetch", _ForwardOnlyEvent(0.001), _ForwardOnlyEvent(0.011)),
             (0, "device", "adam", _ForwardOnlyEvent(0.021), _ForwardOnlyEvent(0.030)),
             (0, "device", "flush", _ForwardOnlyEvent(0.030), _ForwardOnlyEvent(0.040))]
    timings = LaneTimings()
    resolve_spans(start, 0.0, spans, timings, origin=origin)
    (entry,) = timings.events
    assert entry["prefetch"] == pytest.approx((-0.019, -0.009)) and entry["adam"] == pytest.approx((0.001, 0.010))
    assert timings.prefetch_busy_s == pytest.approx(0.010) and timings.device_busy_s == pytest.approx(0.020)
    with pytest.raises(AssertionError, match="backwards"):  # without the origin the early span would run backwards
        resolve_spans(start, 0.0, spans, LaneTimings())
