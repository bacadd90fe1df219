"""Prometheus metrics (prometheus-client), in a registry of their own so that several servers can
live in one process (tests) without clashing in the global one."""
from __future__ import annotations
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, CONTENT_TYPE_LATEST

class Metrics:
  content_type = CONTENT_TYPE_LATEST
  def __init__(self):
    r = self.registry = CollectorRegistry()
    self.requests = Counter("orin_llm_requests", "HTTP requests answered, by endpoint and status code", ["endpoint", "status"], registry=r)
    self.prompt_tokens = Counter("orin_llm_prompt_tokens", "Prompt tokens of the generations run", registry=r)
    self.generated_tokens = Counter("orin_llm_generated_tokens", "Tokens generated", registry=r)
    self.decode_rate = Histogram("orin_llm_decode_tokens_per_second", "Decode speed of a generation (tokens after the first, per second)",
                                 buckets=(1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500), registry=r)
    self.ttft = Histogram("orin_llm_time_to_first_token_seconds", "From a request's arrival to its first generated token (queueing included)",
                          buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=r)
    self.queue_depth = Gauge("orin_llm_queue_depth", "Requests waiting for the engine (the running one excluded)", registry=r)
    self.busy = Gauge("orin_llm_engine_busy", "1 while the engine runs a generation", registry=r)
    self.slots_active = Gauge("orin_llm_slots_active", "KV-cache slots holding a running request", registry=r)
    self.batch_rows = Histogram("orin_llm_decode_batch_rows", "Sequences advanced together by a decode round",
                                buckets=(1, 2, 3, 4, 6, 8, 12, 16), registry=r)
    self.step_seconds = Histogram("orin_llm_decode_step_seconds", "Wall time of one batched decode step (a round's time over its steps)",
                                  buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1), registry=r)
    self.spec_steps = Counter("orin_llm_speculative_verify_steps", "Verify steps of speculative decoding", registry=r)
    self.spec_proposed = Counter("orin_llm_speculative_proposed_tokens", "Tokens proposed to verify steps", registry=r)
    self.spec_accepted = Counter("orin_llm_speculative_accepted_tokens", "Proposed tokens accepted (each verify step also emits one token of its own)", registry=r)
    self.ready = Gauge("orin_llm_ready", "1 once the model is loaded and warmed up", registry=r)
  def render(self) -> bytes: return generate_latest(self.registry)
