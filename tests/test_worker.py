"""The engine thread's scheduler (server/worker.py) over a stand-in engine that records what it is asked to run:
jobs join free slots, leave them when done or cancelled, a cancelled prompt stops within one prefill chunk, and an
engine failure fails the requests it ran while the server goes on."""
import asyncio, threading, time
import numpy as np
import pytest
from orin_llm.sampling import Sampling
from orin_llm.server import worker as W
from orin_llm.server.metrics import Metrics

class Tok:
  stop_ids = frozenset({0})
  def stream(self):
    class D:
      def push(self, i): return f"<{i}>"
      def flush(self): return ""
    return D()

class Slot:
  def __init__(self): self.cached, self.next = [], None

class FakeEngine:
  """Decodes token t -> t + 1 in every slot; prompts run in chunks of 4 tokens."""
  def __init__(self, slots=2, ctx=200):
    self.max_batch, self.max_context, self.slots = slots, ctx, [Slot() for _ in range(slots)]
    self.chunks_run, self.decodes, self.fail, self.resets, self.lock = 0, [], None, 0, threading.Lock()
    self.rounds = []  # the steps of each decode round
    self.log = []  # the prompts' steps queued and the first tokens' fetches and reads, in order
  def common_prefix(self, s, toks):
    n = 0
    for a, b in zip(self.slots[s].cached, toks):
      if a != b: break
      n += 1
    return n
  def prefill_chunks(self, slot, toks, sampling):
    s = self.slots[slot]
    pos = min(self.common_prefix(slot, toks), len(toks) - 1)
    s.cached, s.next = toks[:pos], None
    if slot == getattr(self, "fail_prefill", None): raise RuntimeError("the device went away")
    while pos < len(toks):
      time.sleep(0.01)
      self.chunks_run += 1
      self.log.append(("chunk", slot))
      pos = min(pos + 4, len(toks)); s.cached = toks[:pos]
      yield pos
  def first_token(self, slot):
    s = self.slots[slot]
    if s.next is None: s.next = s.cached[-1] + 1
    return s.next
  def fetch_first(self, slots):
    assert not getattr(self, "fetched", None), "one fetch at a time"
    self.fetched = list(slots)
    self.log.append(("fetch", tuple(slots)))
  def read_first(self):
    slots, self.fetched = self.fetched, None
    self.log.append(("read", tuple(slots)))
    return {b: self.first_token(b) for b in slots}
  def decode(self, slots, n, ahead=False):
    if self.fail: raise self.fail
    self.decodes.append(tuple(slots)); self.rounds.append(n)
    out = np.zeros((n, len(slots)), np.int64)
    for j, sl in enumerate(slots):
      s = self.slots[sl]
      for i in range(n): out[i, j] = s.next + 1 + i
      s.cached, s.next = s.cached + [s.next] + out[:n - 1, j].tolist(), int(out[n - 1, j])
    return out
  def reset(self, slot=None):
    self.resets += 1
    self.fetched = None
    for s in self.slots: s.cached, s.next = [], None

def drain(job) -> list:
  """The events the job has posted so far."""
  out = []
  while not job.events.empty(): out.append(job.events.get_nowait())
  return out

@pytest.fixture
def setup(monkeypatch):
  monkeypatch.setattr(W.Worker, "_warm_up", lambda self: None)
  eng = FakeEngine()
  w = W.Worker(lambda: (eng, Tok()), queue_size=4, metrics=Metrics())
  w.start()
  t0 = time.monotonic()
  while w.state != "ready": assert time.monotonic() - t0 < 10; time.sleep(0.01)
  yield eng, w
  w.stop(); w.thread.join(5)

async def collect(job, timeout=10.0):
  out = []
  while True:
    ev = await asyncio.wait_for(job.events.get(), timeout)
    out.append(ev)
    if ev[0] in ("end", "error"): return out

def run(coro): return asyncio.run(coro)

def test_jobs_share_the_engine_and_each_gets_its_own_tokens(setup):
  eng, w = setup
  async def main():
    loop = asyncio.get_running_loop()
    jobs = [W.Job([10 * (i + 1)] * 5, 6, Sampling(), [], loop) for i in range(3)]  # three jobs, two slots
    for j in jobs: w.submit(j)
    return await asyncio.gather(*[collect(j) for j in jobs])
  res = run(main())
  for i, evs in enumerate(res):
    text = "".join(e[1] for e in evs if e[0] == "text")
    first = 10 * (i + 1) + 1
    assert text == "".join(f"<{t}>" for t in range(first, first + 6)), text
    assert evs[-1][0] == "end" and evs[-1][1] == "length"
  assert max(len(s) for s in eng.decodes) == 2  # two generating together, never more than the slots

def test_a_rounds_tokens_reach_the_loop_in_one_wake_up(setup, rng):
  """The events of a decode round (and of the job's end) reach the event loop in one call_soon_threadsafe, in order:
  a wake-up of the loop's thread a token held the GIL while the device ran (8 streams: 64 a round of 8 steps)."""
  eng, w = setup
  n = int(rng.integers(30, 60))
  async def main():
    loop = asyncio.get_running_loop()
    wakeups, post = [0], loop.call_soon_threadsafe
    def counting(*a, **k):
      wakeups[0] += 1
      return post(*a, **k)
    loop.call_soon_threadsafe = counting
    prompt = [int(rng.integers(100, 1000))] * 3
    job = W.Job(prompt, n, Sampling(), [], loop)
    w.submit(job)
    return prompt, await collect(job), wakeups[0]
  prompt, evs, wakeups = run(main())
  assert "".join(e[1] for e in evs if e[0] == "text") == "".join(f"<{t}>" for t in range(prompt[0] + 1, prompt[0] + 1 + n))
  assert [e[0] for e in evs][0] == "start" and evs[-1][:2] == ("end", "length")
  rounds = len(eng.rounds)
  assert sum(eng.rounds) >= n - 1 and rounds < n // 2  # rounds of several steps
  assert wakeups <= rounds + 3, (wakeups, rounds)  # start, the first token, a wake-up a round (its last with the end)

def test_a_failure_inside_a_round_keeps_its_events(rng, monkeypatch):
  """The detokenizer fails on a token in the middle of a round: the tokens before it still reach the client, in order,
  then the error (Scheduler.fail); the held events are posted, and later events are not held back."""
  start = int(rng.integers(100, 1000))
  bad = start + int(rng.integers(4, 12))  # a token of a decode round (the first comes from the prompt)
  class Failing(Tok):
    def stream(self):
      class D:
        def push(self, i):
          if i == bad: raise RuntimeError("the detokenizer failed")
          return f"<{i}>"
        def flush(self): return ""
      return D()
  monkeypatch.setattr(W.Worker, "_warm_up", lambda self: None)
  w = W.Worker(lambda: (FakeEngine(), Failing()), queue_size=4, metrics=Metrics())
  w.start()
  t0 = time.monotonic()
  while w.state != "ready": assert time.monotonic() - t0 < 10; time.sleep(0.01)
  async def main():
    loop = asyncio.get_running_loop()
    job = W.Job([start] * 3, 40, Sampling(), [], loop)
    w.submit(job)
    first = await collect(job)
    again = W.Job([start + 1000] * 3, 5, Sampling(), [], loop)  # the next job's events are not held back
    w.submit(again)
    return first, await collect(again)
  try: evs, after = run(main())
  finally: w.stop(); w.thread.join(5)
  assert "".join(e[1] for e in evs if e[0] == "text") == "".join(f"<{t}>" for t in range(start + 1, bad))
  assert evs[-1][0] == "error" and "the detokenizer failed" in evs[-1][1]
  assert after[-1][:2] == ("end", "length") and "".join(e[1] for e in after if e[0] == "text") == \
    "".join(f"<{t}>" for t in range(start + 1001, start + 1006))

def test_end_event_times_the_request(setup):
  """The end event's timings (the answer's `timings`): the prompt tokens run (a prefix the slot holds is not run
  again), the time in each phase (the stand-in engine sleeps 10 ms a chunk of 4 tokens), adding up to the request's."""
  eng, w = setup
  rng = np.random.default_rng()
  a_prompt = rng.integers(1, 1000, 9).tolist()
  b_prompt = a_prompt[:6] + rng.integers(1000, 2000, 5).tolist()
  async def main():
    loop = asyncio.get_running_loop()
    out = []
    for prompt, waited in ((a_prompt, 0.05), (b_prompt, None)):
      t0 = time.monotonic()
      job = W.Job(prompt, 5, Sampling(), [], loop, received=t0 - waited if waited else None)
      w.submit(job)
      out.append((await collect(job), time.monotonic() - t0))
    return out
  (a, a_wall), (b, b_wall) = run(main())
  for evs, wall, ran, chunks in ((a, a_wall, 9, 3), (b, b_wall, 5, 2)):
    end = evs[-1]
    assert end[0] == "end" and len(end) == 4
    usage, t = end[2], end[3]
    assert t["prompt_n"] == ran and t["predicted_n"] == usage["completion_tokens"] == 5
    assert t["prompt_ms"] >= chunks * 10 and t["queued_ms"] >= 0 and t["predicted_ms"] >= 0 and t["predicted_per_second"] > 0
    assert t["queued_ms"] + t["prompt_ms"] + t["predicted_ms"] <= wall * 1e3 + 1
  assert a[-1][3]["request_ms"] >= 50 and b[-1][3]["request_ms"] is None

def test_cancelled_prompt_stops_within_one_chunk(setup):
  eng, w = setup
  async def main():
    loop = asyncio.get_running_loop()
    long = W.Job(list(range(1, 4001)), 4, Sampling(), [], loop)  # 1000 chunks of 4
    w.submit(long)
    await asyncio.wait_for(long.events.get(), 5)  # started
    await asyncio.sleep(0.2)
    long.cancel()
    before = eng.chunks_run
    ok = W.Job([5, 6], 2, Sampling(), [], loop)
    w.submit(ok)
    evs = await collect(ok)
    return before, evs
  before, evs = run(main())
  assert eng.chunks_run <= before + 2, (before, eng.chunks_run)  # at most the chunk under way and the other job's
  assert evs[-1][0] == "end" and eng.chunks_run < 200

def test_engine_failure_fails_its_requests_not_the_server(setup):
  eng, w = setup
  eng.fail = RuntimeError("device lost")
  async def main():
    loop = asyncio.get_running_loop()
    a = W.Job([1, 2, 3], 5, Sampling(), [], loop)
    w.submit(a)
    first = await collect(a)
    eng.fail = None
    b = W.Job([7, 8], 3, Sampling(), [], loop)
    w.submit(b)
    return first, await collect(b)
  first, second = run(main())
  assert first[-1][0] == "error" and "device lost" in first[-1][1]
  assert eng.resets >= 1 and w.alive(5)
  assert second[-1][0] == "end" and "".join(e[1] for e in second if e[0] == "text") == "<9><10><11>"

def test_jobs_that_arrive_together_each_prefill_before_the_decode_round():
  """Three short prompts admitted at once: one tick runs each one's chunk and reads its first token, then one decode
  round of all three (not a round after each join); after a long chunk the tick goes on to the round."""
  loop = asyncio.new_event_loop()
  try:
    for long_chunk, rounds in ((128, [(0, 1, 2)]), (3, [(0,)])):
      eng = FakeEngine(slots=3)
      sched = W.Scheduler(eng, Tok(), Metrics(), lookahead=4)
      sched.long_chunk = long_chunk  # 3: every chunk of 4 tokens counts as long
      jobs = [W.Job([10 * (i + 1)] * 4, 6, Sampling(), [], loop) for i in range(3)]
      for j in jobs: sched.admit(j)
      sched.tick(waiting=False)
      loop.run_until_complete(asyncio.sleep(0))
      def drain(q):
        out = []
        while not q.empty(): out.append(q.get_nowait())
        return out
      texts = [[e for e in drain(j.events) if e[0] == "text"] for j in jobs]
      assert eng.decodes == rounds, eng.decodes
      assert [len(t) > 0 for t in texts] == [True, long_chunk > 4, long_chunk > 4], texts
  finally: loop.close()

def test_jobs_that_arrive_during_a_chunk_prefill_before_the_decode_round():
  """Clients that send together reach the queue a few milliseconds apart: the second and third arrive while the
  first one's chunk runs. join() admits them after it, so the same tick runs their chunks and reads their first
  tokens before one decode round of all three; without it a round of lookahead steps of the first came between."""
  loop = asyncio.new_event_loop()
  try:
    eng = FakeEngine(slots=3)
    sched = W.Scheduler(eng, Tok(), Metrics(), lookahead=4)
    jobs = [W.Job([10 * (i + 1)] * 4, 6, Sampling(), [], loop) for i in range(3)]
    sched.admit(jobs[0])
    late = list(jobs[1:])
    def join():
      while late and sched.free_slots(): sched.admit(late.pop(0))
      return False
    sched.tick(waiting=False, join=join)
    loop.run_until_complete(asyncio.sleep(0))
    firsts = []
    for j in jobs:
      evs = []
      while not j.events.empty(): evs.append(j.events.get_nowait())
      firsts.append([e for e in evs if e[0] == "text"][:1])
    assert eng.chunks_run == 3 and eng.decodes == [(0, 1, 2)], (eng.chunks_run, eng.decodes)
    assert all(firsts), firsts
  finally: loop.close()

def test_a_joining_jobs_prompt_is_queued_before_the_first_tokens_read():
  """Jobs that arrive while the first one's prompt runs: each prompt's step is queued before the first token of the
  one before it is read (engine.fetch_first, then read_first), so that the device runs them back to back while the
  host reads; every job still gets its own tokens, and its first token before the decode round."""
  loop = asyncio.new_event_loop()
  try:
    eng = FakeEngine(slots=3)
    sched = W.Scheduler(eng, Tok(), Metrics(), lookahead=4)
    jobs = [W.Job([10 * (i + 1)] * 4, 3, Sampling(), [], loop) for i in range(3)]
    sched.admit(jobs[0])
    late = list(jobs[1:])
    def join():
      if late: sched.admit(late.pop(0))  # one arrives during each prompt's step
      return False
    sched.tick(waiting=False, join=join)
    assert eng.log == [("chunk", 0), ("fetch", (0,)), ("chunk", 1), ("read", (0,)), ("fetch", (1,)), ("chunk", 2),
                       ("read", (1,)), ("fetch", (2,)), ("read", (2,))], eng.log
    assert eng.decodes == [(0, 1, 2)], eng.decodes
    for _ in range(5):
      if sched.busy(): sched.tick(waiting=False)
    loop.run_until_complete(asyncio.sleep(0))
    for i, j in enumerate(jobs):
      evs = drain(j)
      assert "".join(e[1] for e in evs if e[0] == "text") == "".join(f"<{10 * (i + 1) + 1 + k}>" for k in range(3)), evs
  finally: loop.close()

def test_a_failure_while_a_first_token_is_fetched_fails_its_job_too():
  """The second job's prompt fails while the first one's first token is fetched and not yet read: both jobs get the
  error (Worker runs Scheduler.fail), the engine is reset (the fetch dropped), and the next job runs."""
  loop = asyncio.new_event_loop()
  try:
    eng = FakeEngine(slots=2)
    eng.fail_prefill = 1
    sched = W.Scheduler(eng, Tok(), Metrics(), lookahead=4)
    jobs = [W.Job([10 * (i + 1)] * 4, 3, Sampling(), [], loop) for i in range(3)]
    sched.admit(jobs[0])
    late = [jobs[1]]
    def join():
      if late: sched.admit(late.pop())
      return False
    with pytest.raises(RuntimeError): sched.tick(waiting=False, join=join)
    assert eng.log[:2] == [("chunk", 0), ("fetch", (0,))] and eng.fetched == [0], eng.log
    sched.fail(RuntimeError("the device went away"))
    assert eng.fetched is None and not sched.busy()
    eng.fail_prefill = None
    sched.admit(jobs[2])
    for _ in range(5):
      if sched.busy(): sched.tick(waiting=False)
    loop.run_until_complete(asyncio.sleep(0))
    evs = [drain(j) for j in jobs]
    assert [e[0] for e in evs[0] if e[0] != "start"] == ["error"] and [e[0] for e in evs[1] if e[0] != "start"] == ["error"], evs[:2]
    assert "".join(e[1] for e in evs[2] if e[0] == "text") == "<31><32><33>", evs[2]
  finally: loop.close()

class GroupEngine(FakeEngine):
  """FakeEngine with a step that prefills every slot's prompt together, group_rows tokens each."""
  group_rows = 4
  def __init__(self, slots=4):
    super().__init__(slots=slots)
    self.together = []
  def prefill_together(self, jobs):
    self.together.append(sorted(jobs))
    self.log.append(("together", tuple(sorted(jobs))))
    out = {}
    for b, (toks, _) in jobs.items():
      s = self.slots[b]
      start = min(self.common_prefix(b, toks), len(toks) - 1)
      s.cached, s.next = toks[:start + min(self.group_rows, len(toks) - start)], None
      out[b] = len(s.cached)
    return out

def test_short_prompts_that_join_together_prefill_in_one_step():
  """Three short prompts and a long one admitted at once: the short ones run their tokens in a step over all slots,
  each one's first token read once the next step is queued, the long one (more than long_chunk tokens left) a chunk of
  its own. Next tick the 6-token prompt's rest and the long one's (now short enough) run together; the long one's
  last tokens then run alone, in its own chunk. Every job gets its own tokens."""
  loop = asyncio.new_event_loop()
  try:
    eng = GroupEngine()
    sched = W.Scheduler(eng, Tok(), Metrics(), lookahead=2)
    sched.long_chunk = 8
    prompts = [[11] * 4, [21] * 6, list(range(30, 42)), [41] * 3]
    jobs = [W.Job(p, 3, Sampling(), [], loop) for p in prompts]
    for j in jobs: sched.admit(j)
    sched.tick(waiting=False)
    assert eng.together == [[0, 1, 3]] and eng.chunks_run == 1, (eng.together, eng.chunks_run)
    assert sorted(r.slot for r in sched.runs.values() if r.prefill is not None) == [1, 2]  # 0 and 3 decode
    for _ in range(10):
      if not sched.busy(): break
      sched.tick(waiting=False)
    assert eng.together == [[0, 1, 3], [1, 2]] and eng.chunks_run == 2, (eng.together, eng.chunks_run)
    loop.run_until_complete(asyncio.sleep(0))
    for p, j in zip(prompts, jobs):
      evs = []
      while not j.events.empty(): evs.append(j.events.get_nowait())
      text = "".join(e[1] for e in evs if e[0] == "text")
      assert text == "".join(f"<{p[-1] + 1 + i}>" for i in range(3)), (p, text)
  finally: loop.close()

def test_jobs_that_arrive_before_the_engine_takes_them_count_free_slots(monkeypatch):
  """queue_size bounds the jobs that wait for a slot: jobs that arrive together while slots are free (before the
  engine thread's next tick takes them) are not refused; the job past free slots + queue_size is, with Retry-After."""
  w = W.Worker(lambda: None, queue_size=2, metrics=Metrics())  # its thread not started: nothing is taken from the queue
  loop = asyncio.new_event_loop()
  try:
    for free in ([0, 1], [1], []):
      w.waiting.clear()
      w.sched = type("Sched", (), {"free_slots": lambda self, f=free: list(f)})()
      w.engine = type("Eng", (), {"max_batch": 2})()
      jobs = [W.Job([5] * 3, 2, Sampling(), [], loop) for _ in range(2 + len(free))]
      for j in jobs: w.submit(j)
      with pytest.raises(W.QueueFull) as e: w.submit(W.Job([5] * 3, 2, Sampling(), [], loop))
      assert e.value.retry_after >= 1 and w.depth() == 2 + len(free), free
  finally: loop.close()

def test_a_young_stream_decodes_in_short_rounds():
  """Until a stream has a round of lookahead tokens its rounds are 2 steps, so that a client who arrives just after it
  (clients that send together reach the queue milliseconds apart) waits for 2 steps, not for lookahead of them, before
  its prompt runs; then rounds of lookahead (the last one what max_tokens leaves). A job that joins a running one
  makes the rounds short again."""
  loop = asyncio.new_event_loop()
  try:
    lookahead, max_new = int(np.random.default_rng().integers(4, 9)), 30
    eng = FakeEngine(slots=2)
    sched = W.Scheduler(eng, Tok(), Metrics(), lookahead=lookahead)
    sched.admit(W.Job([5] * 3, max_new, Sampling(), [], loop))
    while sched.busy(): sched.tick(waiting=False)
    made, want = 1, []  # the prefill's choice is the first token
    while made < max_new:
      k = min(2 if made < lookahead else lookahead, max_new - made); want.append(k); made += k
    assert eng.rounds == want, (lookahead, eng.rounds, want)
    eng.rounds.clear()
    a = W.Job([6] * 3, max_new, Sampling(), [], loop)
    sched.admit(a)
    for _ in range(lookahead + 2):  # a alone, past its young rounds (ceil((lookahead - 1) / 2) of them after its prefill)
      sched.tick(waiting=False)
      if eng.rounds and eng.rounds[-1] == lookahead: break
    assert eng.rounds[-1] == lookahead and set(eng.rounds[:-1]) <= {2}, eng.rounds
    sched.admit(W.Job([7] * 3, max_new, Sampling(), [], loop))
    sched.tick(waiting=False)
    assert eng.rounds[-1] == 2 and eng.decodes[-1] == (0, 1), (eng.rounds, eng.decodes)
  finally: loop.close()

def test_an_idle_engine_waits_for_the_requests_being_read():
  """gather_ms (Worker.gather): an idle engine that takes a job waits up to Worker.gather for the generation requests being
  read at that moment (Worker.reading), so that clients which send together start in one tick: with it the second
  job, queued 20 ms after the first, is admitted with it; without it, or with no request being read (a lone client),
  the first goes alone and at once; a request that never comes costs at most the bound."""
  loop = asyncio.new_event_loop()
  try:
    def join(gather, reading, late_after, finish_reading):
      w = W.Worker(lambda: None, queue_size=4, metrics=Metrics())
      w.gather, w.reading = gather, reading
      sched = W.Scheduler(FakeEngine(slots=4), Tok(), Metrics(), lookahead=4)
      jobs = [W.Job([5 + i] * 3, 2, Sampling(), [], loop) for i in range(2)]
      w.queue.put(jobs[0])
      def later():
        time.sleep(late_after)
        w.queue.put(jobs[1])
        if finish_reading: w.reading -= 1  # as Reading.done() after Worker.submit
      t = threading.Thread(target=later); t.start()
      t0 = time.monotonic()
      assert w._join(sched, idle_wait=True)
      took = time.monotonic() - t0
      t.join()
      return len(sched.runs), took
    n, took = join(2.0, 1, 0.02, True)
    assert n == 2 and took < 1.0, (n, took)  # gathered: both in one join, which ends once nothing is being read
    n, took = join(0.0, 1, 0.3, True)
    assert n == 1 and took < 0.2, (n, took)  # off: the first alone, at once
    n, took = join(2.0, 0, 0.3, False)
    assert n == 1 and took < 0.2, (n, took)  # a lone client: nothing being read, no wait
    n, took = join(0.3, 1, 0.6, False)
    assert n == 1 and 0.3 <= took < 0.55, (n, took)  # the request never came in time: the bound
  finally: loop.close()

def test_requests_being_read():
  """Worker(gather=) keeps the wait in seconds; Reading counts a request once, however often done() is called, and
  counts it out when its handler fails (the config key's bounds: test_server.py's test_config_errors)."""
  assert W.Worker(lambda: None, queue_size=1, metrics=Metrics(), gather=0.002).gather == 0.002
  w = W.Worker(lambda: None, queue_size=1, metrics=Metrics())
  with W.Reading(w) as r:
    assert w.reading == 1
    r.done(); r.done()  # once, however often called
    assert w.reading == 0
  with pytest.raises(ValueError):
    with W.Reading(w): raise ValueError  # a handler that fails before its job is queued
  assert w.reading == 0

