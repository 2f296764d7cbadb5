"""An OpenAI-compatible endpoint that records what an agent samples, for training agents written
against the OpenAI API (the `openai` client, LangChain, smolagents, a loop of one's own).

`AgentEndpoint(engine, model)` serves the API (reasonrl.rollout.openai_server: chat with tools
through the chat template, raw completions, streaming, n, log-probs) on loopback, in front of a
PrefixEngine, in this process. Each episode gets its own base URL:

    with AgentEndpoint(engine, "my-model") as endpoint:
        episode = endpoint.open_episode(sampling, seed=7, timeout_s=60)
        run_my_agent(episode.base_url, "my-model")        # any OpenAI client, pointed there
        record = episode.finish()                         # later requests are refused
        trajectories = record.trajectories()              # reasonrl.agents.trajectories

For every request it records the prompt token ids it gave the engine and what the engine sampled
(token ids and log-probs, exactly), which `record.trajectories()` merges where a call's prompt
extends an earlier one. It samples as the episode's `sampling` says: a request may repeat its
temperature, top_p and top_k but not change them (the learner recomputes log-probs at the run's),
`max_tokens` is capped at `sampling.max_new_tokens` (its default too), the stop strings join
`sampling.stop`, and each call's seed derives from the episode's seed and the call's number (a
request's own `seed` is refused), so an episode whose calls are the same samples the same.

It refuses, with a 4xx the client raises: a model other than `model` (404), a request of an episode
whose time is over or which is finished (410), a field or value it does not support (400). Each
refusal is kept in the record: the episode's samples are not what the agent meant to do.

Requests of concurrent episodes are batched: they wait for each other (until no new request has
come for `batch_window_s`, or at once when every open episode waits) and go to the engine in one `continue_from` per sampling
setting, each prefix with its own seed. A failure of the engine is not an agent's: it is kept in
`engine_error` for the caller to raise.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Self

from reasonrl.agents.trajectories import Call, Trajectory, assemble
from reasonrl.rollout.openai_protocol import ApiError, RequestSampling
from reasonrl.rollout.openai_server import ApiHttpServer, CompletionBackend, ModelScorer
from reasonrl.seeds import derive_seed, problem_seed
from reasonrl.types import Completion, SamplingParams

EPISODES = "/episodes/"


@dataclass(frozen=True)
class EpisodeRecord:
    """What an episode sampled: each choice of each request, in order; the refusals it got; whether
    its time ran out."""

    calls: tuple[Call, ...]
    refusals: tuple[str, ...]
    timed_out: bool

    def trajectories(self) -> list[Trajectory]:
        return assemble(self.calls)


class Episode:
    """One episode's door into the endpoint: `base_url` to give the agent; `finish()` closes it."""

    def __init__(self, endpoint: AgentEndpoint, key: str, sampling: SamplingParams, seed: int, timeout_s: float):
        self.endpoint, self.key, self.sampling, self.seed = endpoint, key, sampling, seed
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.calls: list[Call] = []
        self.refusals: list[str] = []
        self.requests = 0
        self.finished = False
        self.record: EpisodeRecord | None = None
        self.lock = threading.Lock()
        model = getattr(endpoint.engine, "model", None)
        self.backend = CompletionBackend(
            tokenizer=endpoint.engine.tokenizer, chat_template=endpoint.engine.chat_template,
            model_name=endpoint.model_name, generate=self._generate, sampling=self._sampling,
            scorer=ModelScorer(model, _OpenGuard(self, endpoint.engine_lock)) if model is not None else None,
            on_sampled=self._record)

    @property
    def base_url(self) -> str:
        return f"{self.endpoint.address}{EPISODES}{self.key}/v1"

    @property
    def open(self) -> bool:
        return not self.finished and time.monotonic() < self.deadline

    def finish(self) -> EpisodeRecord:
        """Close the episode (its later requests are refused) and return what it sampled: call it as
        soon as the agent returns, since the time it is called at decides whether the episode ran out
        of time (a second call returns the first's record)."""
        with self.lock:
            if self.record is None:
                self.finished = True
                self.record = EpisodeRecord(tuple(self.calls), tuple(self.refusals),
                                            timed_out=time.monotonic() >= self.deadline)
            return self.record

    def check_open(self) -> None:
        if self.finished:
            raise ApiError(410, "this episode is over: its requests are no longer answered", code="episode_over")
        if time.monotonic() >= self.deadline:
            raise ApiError(410, f"this episode's time ({self.timeout_s:g} s) is over: its requests are no longer "
                                "answered", code="episode_timeout")

    # --- what the backend asks of the episode

    def models(self) -> dict[str, Any]:
        return self.backend.models()

    def answer(self, path: str, body: Any) -> dict[str, Any] | list[dict[str, Any]]:
        try:
            self.check_open()
            return self.backend.answer(path, body)
        except ApiError as exc:
            with self.lock:
                self.refusals.append(f"{path}: {exc.status} {exc.message}")
            raise

    def _sampling(self, asked: RequestSampling) -> SamplingParams:
        s = self.sampling
        for name, value, own in (("temperature", asked.temperature, s.temperature), ("top_p", asked.top_p, s.top_p),
                                 ("top_k", max(asked.top_k or 0, 0) if asked.top_k is not None else None, s.top_k)):
            if value is not None and value != own:
                raise ApiError(400, f"'{name}'={value!r} differs from the {name} this endpoint samples at ({own!r}): "
                                    f"leave it out, or train at {name}={value!r}", param=name)
        if asked.seed is not None:
            raise ApiError(400, "'seed' is not taken: each call's seed derives from the episode's", param="seed")
        with self.lock:
            call = self.requests
            self.requests += 1
        return replace(s, n=asked.n, max_new_tokens=min(asked.max_tokens or s.max_new_tokens, s.max_new_tokens),
                       stop=(*asked.stop, *s.stop), seed=derive_seed(self.seed, "call", call),
                       ignore_eos=asked.ignore_eos or s.ignore_eos)

    def _generate(self, prefixes: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return self.endpoint.batcher.generate(self, prefixes, sampling)

    def _record(self, prompt_ids: list[int], completions: list[Completion]) -> None:
        with self.lock:
            self.calls.extend(Call(tuple(prompt_ids), completion) for completion in completions)


class _OpenGuard:
    """The engine's lock, entered only while the episode is open (a scorer's forward pass never runs
    on a model the trainer is changing after the episode ended)."""

    def __init__(self, episode: Episode, lock: threading.Lock):
        self.episode, self.lock = episode, lock

    def __enter__(self) -> None:
        self.lock.acquire()
        if not self.episode.open:
            self.lock.release()
            self.episode.check_open()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


@dataclass
class _Ticket:
    episode: Episode
    prefixes: list[list[int]]
    sampling: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: list[list[Completion]] | None = None
    error: BaseException | None = None


class _Batcher:
    """Runs the requests of concurrent episodes through the engine together (module docstring)."""

    def __init__(self, endpoint: AgentEndpoint, window_s: float):
        self.endpoint, self.window_s = endpoint, window_s
        self.pending: list[_Ticket] = []
        self.wake = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="reasonrl-agent-batcher", daemon=True)
        self.thread.start()

    def generate(self, episode: Episode, prefixes: list[list[int]], sampling: SamplingParams
                 ) -> list[list[Completion]]:
        ticket = _Ticket(episode, prefixes, sampling)
        with self.wake:
            self.pending.append(ticket)
            self.wake.notify_all()
        ticket.done.wait()
        if ticket.error is not None:
            raise ticket.error
        return ticket.result  # type: ignore[return-value]  # set with done

    def stop(self) -> None:
        with self.wake:
            self.stopped = True
            self.wake.notify_all()
        self.thread.join()

    def _run(self) -> None:
        while True:
            with self.wake:
                while not self.pending and not self.stopped:
                    self.wake.wait()
                if self.stopped:
                    for ticket in self.pending:
                        ticket.error = ApiError(503, "the endpoint is closing", kind="server_error")
                        ticket.done.set()
                    return
                # The window runs from the latest arrival: the agents of a step start one after another,
                # and a window from the first request split their first calls into several engine calls.
                arrived, count = time.monotonic(), len(self.pending)
                while (len({id(t.episode) for t in self.pending}) < self.endpoint.open_episodes()
                       and (left := self.window_s - (time.monotonic() - arrived)) > 0):
                    self.wake.wait(left)
                    if len(self.pending) != count:
                        arrived, count = time.monotonic(), len(self.pending)
                batch, self.pending = self.pending, []
            with self.endpoint.engine_lock:  # episodes close before the caller takes it: none ends mid-batch
                self._serve(batch)

    def _serve(self, batch: list[_Ticket]) -> None:
        live = []
        for ticket in batch:
            if ticket.episode.open:
                live.append(ticket)
            else:
                try:
                    ticket.episode.check_open()
                except ApiError as exc:
                    ticket.error = exc
                ticket.done.set()
        settings: dict[SamplingParams, list[_Ticket]] = {}
        for ticket in live:
            settings.setdefault(replace(ticket.sampling, seed=0), []).append(ticket)
        for sampling, tickets in settings.items():
            prefixes = [prefix for t in tickets for prefix in t.prefixes]
            seeds = [problem_seed(t.sampling.seed, i) for t in tickets for i in range(len(t.prefixes))]
            try:
                outputs = self.endpoint.engine.continue_from(prefixes, sampling, seeds)
            except Exception as exc:  # noqa: BLE001 - handed to the caller of the endpoint, whose error it is
                self.endpoint.engine_error = self.endpoint.engine_error or exc
                for ticket in tickets:
                    ticket.error = ApiError(500, f"the engine failed: {type(exc).__name__}: {exc}", kind="server_error")
                    ticket.done.set()
                continue
            start = 0
            for ticket in tickets:
                ticket.result = outputs[start:start + len(ticket.prefixes)]
                start += len(ticket.prefixes)
                ticket.done.set()


class AgentEndpoint:
    """The recording endpoint in front of `engine` (a PrefixEngine: `continue_from(prefixes, sampling,
    seeds)`, `tokenizer`, `chat_template`; its `model`, when it has one, gives log-prob alternatives),
    serving the model `model_name` on `host` (loopback) at a free port. Start it (`start()` or `with`),
    open an episode per agent run, `close()` at the end. See the module docstring."""

    def __init__(self, engine: Any, model_name: str, *, host: str = "127.0.0.1", batch_window_s: float = 0.05):
        self.engine, self.model_name = engine, model_name
        self.engine_lock = threading.Lock()
        self.engine_error: BaseException | None = None
        self.server_errors: list[str] = []
        self.episodes: dict[str, Episode] = {}
        self._episodes_lock = threading.Lock()
        self.batcher = _Batcher(self, batch_window_s)
        self._http = ApiHttpServer(self._route, host=host, name="reasonrl-agent-endpoint", on_error=self._failed)

    @property
    def address(self) -> str:
        return self._http.address

    def start(self) -> Self:
        self._http.start()
        return self

    def close(self) -> None:
        self._http.close()
        self.batcher.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open_episode(self, sampling: SamplingParams, *, seed: int, timeout_s: float) -> Episode:
        """A new episode sampling as `sampling` says (its seed: `seed`), open for `timeout_s` seconds."""
        episode = Episode(self, secrets.token_hex(8), sampling, seed, timeout_s)
        with self._episodes_lock:
            self.episodes = {k: e for k, e in self.episodes.items() if not e.finished}  # forget closed ones
            self.episodes[episode.key] = episode
        return episode

    def quiesce(self, episodes: Sequence[Episode]) -> None:
        """Finish `episodes` and wait until the engine is not running a request of theirs: from then on
        the caller may change the engine (load weights) while stray requests are refused."""
        for episode in episodes:
            episode.finish()
        with self.engine_lock:
            pass

    def open_episodes(self) -> int:
        with self._episodes_lock:
            return sum(episode.open for episode in self.episodes.values())

    def _route(self, path: str) -> tuple[Episode, str]:
        key, _, rest = path.removeprefix(EPISODES).partition("/")
        if not path.startswith(EPISODES) or not rest.startswith("v1"):
            raise ApiError(404, f"no route {path}: this endpoint serves {EPISODES}<episode>/v1/...",
                           kind="not_found_error")
        with self._episodes_lock:
            episode = self.episodes.get(key)
        if episode is None:
            raise ApiError(410, "no open episode has this URL (it finished, or never was)", code="episode_over")
        return episode, "/" + rest.removeprefix("v1").lstrip("/")

    def _failed(self, path: str, exc: BaseException) -> None:
        self.server_errors.append(f"{path}: {type(exc).__name__}: {exc}")
