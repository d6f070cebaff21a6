"""A loaded Hugging Face causal LM, ready for continuous inputs.

:class:`ContinuousLM` owns a stock model and its tokenizer and evaluates signals on
it: logits or next-token distributions at chosen positions, in chunks, and greedy
generation that continues a continuous prompt through the KV cache. The model itself
is never modified outside a call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

import torch

from contllm.core import forward
from contllm.core.engine import Context, Engine, Positions, check_signals
from contllm.core.families import Family, family_of, relative_positions
from contllm.core.signal import Signal, SignalBatch
from contllm.errors import SignalError, UnsupportedModelError
from contllm.generation import GENERATE_OPTIONS, Generation, generate
from contllm.internals.activations import ActivationCache, ReturnType, hooked_logits, run_with_cache, run_with_hooks
from contllm.internals.gradients import Gradients, gradients
from contllm.internals.interop import ForwardInputs, forward_kwargs, trace
from contllm.internals.intervention import HookFn, HookState, add_hook, hooks, hooks_on, reset_hooks

__all__ = ["Context", "ContinuousLM", "Generation", "Positions", "wrap"]


def _check_model(model: Any) -> None:
    """UnsupportedModelError unless ``model`` is a loaded transformers model (a module with a config and weights on a device)."""
    if isinstance(model, (str, bytes)):
        raise UnsupportedModelError(
            f"ContinuousLM takes a loaded model, got the name {str(model)[:80]!r}; load one with contllm.load({str(model)[:80]!r})"
        )
    if (
        not isinstance(model, torch.nn.Module)
        or not hasattr(model, "config")
        or not hasattr(model, "get_input_embeddings")
    ):
        raise UnsupportedModelError(
            f"ContinuousLM takes a transformers causal LM (a torch module with a config), got {type(model).__name__}; "
            "load one with contllm.load(...) or AutoModelForCausalLM.from_pretrained(...)"
        )
    if any(p.device.type == "meta" for p in model.parameters()):
        raise UnsupportedModelError(
            "the model's weights are on the meta device (not loaded); load it on 'cpu' or a GPU, without offloading"
        )


class ContinuousLM:
    """A stock causal LM and its tokenizer, evaluated on continuous signals.

    model: a transformers causal LM of a supported family (any you already hold, e.g.
        from ``AutoModelForCausalLM.from_pretrained``), loaded with an attention
        implementation of its family's ``backends`` ("eager" or "sdpa": the ones that
        add a float mask to the logits). It is used as it is: put it in eval mode, or
        use :func:`wrap`, which does.
    tokenizer: its tokenizer (a fast one, for character spans), or None.
    info: optional metadata of where the model came from.
    """

    def __init__(self, model: Any, tokenizer: Any = None, info: Any = None) -> None:
        _check_model(model)
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.family: Family = family_of(model.config)
        impl = getattr(model.config, "_attn_implementation", None) or "eager"
        if impl not in self.family.backends:
            raise UnsupportedModelError(
                f"attention implementation {impl!r} cannot take a continuous-time mask for "
                f"{self.family.name}; load the model with attn_implementation in {self.family.backends}"
            )
        self.attn_implementation = impl
        self._state_dtype: torch.dtype | None = None
        #: Whether the model sees positions only through their differences (a rotary family
        #: with fixed frequencies): the engine then evaluates with the time origin moved
        #: near the read positions (:func:`contllm.core.families.relative_positions`).
        self.relative_positions: bool = relative_positions(self.family, model.config)

    # ------------------------------------------------------------------ basics
    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def state_dtype(self) -> torch.dtype:
        """The dtype of the hidden state between matmuls: the model's own, or float32 inside
        :func:`contllm.core.precision.float32_state` (input embeddings and masks are built in it)."""
        return self._state_dtype or self.dtype

    @contextmanager
    def _state_as(self, dtype: torch.dtype) -> Iterator[None]:
        saved, self._state_dtype = self._state_dtype, dtype
        try:
            yield
        finally:
            self._state_dtype = saved

    def __repr__(self) -> str:
        name = getattr(self.info, "name", None) or getattr(self.model.config, "_name_or_path", "") or "model"
        return f"ContinuousLM({name!r}, family={self.family.name}, dtype={self.dtype}, device={self.device})"

    def patched(self, *, grad: bool = False) -> AbstractContextManager[Any]:
        """The model, able to take continuous inputs, for as long as the context lasts: :func:`contllm.core.forward.patched`.

        In inference mode; with ``grad``, recording the autograd graph instead, with every
        parameter frozen (gradients reach the inputs and activations, never the weights).
        """
        return forward.patched(self, grad=grad)

    def signal(self, text: str, *, add_special_tokens: bool = True) -> Signal:
        """Tokenize ``text`` into a signal of unit durations (times 0, 1, 2, ...)."""
        if self.tokenizer is None:
            raise SignalError("this model has no tokenizer; build signals from ids or embeddings")
        return Signal.from_text(self.tokenizer, text, add_special_tokens=add_special_tokens)

    def embed(self, signals: Signal | Sequence[Signal]) -> list[torch.Tensor]:
        """Input embeddings [tokens, hidden] of each signal, by the model's own embedding module.

        Durations play no part here: a signal whose every duration is 0 is embedded too.
        """
        items = check_signals(signals, single_ok=True, evaluated=False)
        embedding = self.model.get_input_embeddings()
        with torch.inference_mode():
            return [s.embedded(embedding).embeds for s in items]  # type: ignore[misc]

    # ------------------------------------------------------------------ forward
    def forward_batch(self, batch: SignalBatch, **options: Any) -> tuple[torch.Tensor, Context | None]:
        """One forward of a padded batch; returns logits and (with a cache) the extended context.

        The forward every evaluation runs, :func:`contllm.core.forward.forward_batch`: this method hands
        ``batch`` and the keyword options (``logits_to_keep``, ``context``, ``use_cache``, ``prefix``,
        ``origin``, described there) on to it. Call inside :meth:`patched`.
        """
        return forward.forward_batch(self, batch, **options)

    def logits(
        self,
        signals: Signal | Sequence[Signal],
        *,
        positions: Positions = "last",
        batch_size: int | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Logits of the model on each signal, in float32 on the CPU, through an :class:`~contllm.core.engine.Engine`.

        positions: "last" -> [batch, vocab]; an int or a list of k ints (token indices of
            each signal, negative from its end) -> [batch, vocab] or [batch, k, vocab];
            "all" -> a list of [tokens_i, vocab] tensors.
        batch_size: a shorthand for the engine's one budget knob: room for this many of
            the longest signals per forward (max_batch_tokens = batch_size x longest);
            None: the engine's default budget. It bounds memory, never changes results.
        A single Signal drops the batch dimension. ``Engine(lm).logits(signals)`` gives
        the same numbers (a half-precision model runs with a float32 state either way).

        While hooks are on (inside ``lm.hooks(signals, ...)`` or :func:`contllm.internals.activations.patch`,
        or after :meth:`add_hook`), the call runs one padded forward of ``signals`` through
        them, as :meth:`run_with_hooks` does, instead of the engine (no chunks, no reordering:
        ``batch_size`` does not apply; a prefix the signals share runs once, see
        :mod:`contllm.internals.prefixed`), so the hooks see every position of
        the signals they were made for; inside a context made for other signals it raises
        SignalError naming what differs. ``Engine(lm)`` applies no hook added with
        :meth:`add_hook`, and inside :meth:`hooks` its forwards meet the context's hooks held
        only to their batch shape: call ``lm.logits``.

        Raises SignalError for anything but a Signal or a list of them, a token id outside
        the vocabulary, embeds of the wrong width, a bad ``positions``, a read position
        with nothing to attend to (every token at or before its time has duration 0, e.g.
        every token deleted), or a signal's tensors edited in place to values it cannot
        hold (NaN or negative durations, times beyond +-MAX_TIME). A signal beyond the model's max_position_embeddings (in
        tokens or in time) runs, with a :class:`~contllm.core.engine.ContextLengthWarning` once per model.
        """
        single = isinstance(signals, Signal)
        items = check_signals(signals, single_ok=True)
        budget = None
        if batch_size is not None:
            if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
                raise SignalError(f"batch_size must be an integer >= 1 or None, got {batch_size!r}")
            budget = batch_size * max(len(s) for s in items)
        if hooks_on(self):
            return hooked_logits(self, signals, positions)
        out = Engine(self, max_batch_tokens=budget).logits(items, positions=positions)
        return out[0] if single else out

    def probs(
        self, signals: Signal | Sequence[Signal], *, positions: Positions = "last", batch_size: int | None = None
    ) -> torch.Tensor | list[torch.Tensor]:
        """Next-token distributions (softmax of :meth:`logits`, float32), same shapes."""
        out = self.logits(signals, positions=positions, batch_size=batch_size)
        if isinstance(out, list):
            return [torch.softmax(x, dim=-1) for x in out]
        return torch.softmax(out, dim=-1)

    def to_tokens(self, text: str | Sequence[str], *, add_special_tokens: bool = True) -> torch.Tensor:
        """Token ids of ``text`` as TransformerLens's ``to_tokens`` gives them: long [1, tokens] ([batch, tokens] for a list).

        The tokenizer's own special tokens are added (a BOS where the model's tokenizer adds
        one; TransformerLens prepends one by default whatever the model). A list must
        tokenize to one length: contllm pads signals itself, so give ragged texts as signals,
        ``[lm.signal(t) for t in texts]``. ``Signal.from_ids(tokens[b])`` makes a signal of
        unit durations. SignalError without a tokenizer, for a text of no token, or for
        texts of different token counts.
        """
        texts = [text] if isinstance(text, str) else list(text) if isinstance(text, Sequence) else None
        if not texts or not all(isinstance(t, str) for t in texts):
            raise SignalError(f"to_tokens takes a text or a list of texts, got {type(text).__name__}")
        rows = [self.signal(t, add_special_tokens=add_special_tokens).token_ids for t in texts]
        lengths = [len(r) for r in rows if r is not None]
        if len(set(lengths)) > 1:
            raise SignalError(
                f"the texts tokenize to different lengths ({', '.join(map(str, lengths))}); contllm pads signals "
                "itself: run [lm.signal(text) for text in texts] instead of a padded token tensor"
            )
        return torch.stack([r for r in rows if r is not None])

    def to_str_tokens(self, signal: Signal | str) -> list[str]:
        """Each token of ``signal`` (or of the signal of a text) as the tokenizer decodes it alone; ``[embed]`` for a
        token given only as an embedding. SignalError without a tokenizer."""
        if isinstance(signal, str):
            signal = self.signal(signal)
        if not isinstance(signal, Signal):
            raise SignalError(f"to_str_tokens takes a Signal or a text, got {type(signal).__name__}")
        if self.tokenizer is None:
            raise SignalError("this model has no tokenizer to decode tokens with; see signal.pieces()")
        if signal.token_ids is None:
            return ["[embed]"] * len(signal)
        return [self.tokenizer.decode([int(i)]) for i in signal.token_ids]

    def run_with_cache(
        self,
        signals: Signal | Sequence[Signal],
        *,
        names: Any = None,
        positions: Positions = "all",
        names_filter: Any = None,
        remove_batch_dim: bool = False,
    ) -> ActivationCache:
        """Named activations of one padded forward of ``signals``: :func:`contllm.internals.activations.run_with_cache`.

        names (or TransformerLens's ``names_filter``): activation names
        (``blocks.{i}.hook_resid_post``, ..., :mod:`contllm.internals.hookpoints`), short forms
        (``("resid_post", 5)``) or predicates, one or a list; None: all. positions: "all",
        "last", a token index or a list of them. remove_batch_dim: for one signal, a cache
        without the batch dimension. Returns an
        :class:`~contllm.internals.activation_cache.ActivationCache` (one tensor per signal and
        name on the CPU, float64 for a float64 model and float32 otherwise, with each read
        position's time; ``cache[name]`` pads a ragged batch on the left with zeros). Hooks
        of an enclosing :meth:`hooks` context (made for these signals) and of :meth:`add_hook`
        apply. A prefix the signals share runs once where only positions after it are read
        (:mod:`contllm.internals.prefixed`); the hooks still see every position.
        """
        return run_with_cache(
            self,
            signals,
            names=names,
            positions=positions,
            names_filter=names_filter,
            remove_batch_dim=remove_batch_dim,
        )

    def run_with_hooks(
        self,
        signals: Signal | Sequence[Signal],
        *,
        fwd_hooks: Any = (),
        bwd_hooks: Any = (),
        positions: Positions | None = None,
        grad: bool = False,
        return_type: ReturnType = "logits",
    ) -> torch.Tensor | list[torch.Tensor] | None:
        """Logits (or the loss) of ``signals`` with hook functions for this forward: :func:`contllm.internals.activations.run_with_hooks`.

        fwd_hooks, bwd_hooks: (name or predicate, fn) pairs; ``fn(activation, hook)`` returns
        a replacement or None, ``hook.name``, ``hook.layer()``, ``hook.times`` and
        ``hook.durations`` describe the point and the padded batch. positions: as for
        :meth:`logits` (None: "last"). return_type: "logits" (shaped as :meth:`logits` gives
        them), "loss" (TransformerLens's mean next-token cross-entropy over the real
        positions, pooled over the batch) or None. With bwd_hooks (or ``grad=True``) the
        result carries the autograd graph. Nothing is left on the model afterwards, also when
        a hook raises. SignalError for hooks that are not a list of pairs (a bare function),
        a target that is no name or predicate, a hook function that returns anything but
        None or a float tensor of the value's shape, another return_type, or a signal
        :meth:`logits` would refuse.
        """
        return run_with_hooks(
            self,
            signals,
            fwd_hooks=fwd_hooks,
            bwd_hooks=bwd_hooks,
            positions=positions,
            grad=grad,
            return_type=return_type,
        )

    def hooks(
        self, signals: Signal | Sequence[Signal], fwd_hooks: Any = (), bwd_hooks: Any = ()
    ) -> AbstractContextManager[HookState]:
        """Hook functions for every forward of ``signals`` while the context lasts: :func:`contllm.internals.intervention.hooks`.

        E.g. ``with lm.hooks(signals, [("blocks.3.attn.hook_z", ablate)]): cache = lm.run_with_cache(signals)``.
        The hooks are bound to ``signals``: inside, :meth:`run_with_cache`, :meth:`run_with_hooks`,
        :meth:`gradients` and :meth:`logits` of these very signals run through them (``lm.logits``
        then runs one padded forward, not the engine), and of any other signals raise
        SignalError naming what differs (token ids or embeddings, durations, times).
        :meth:`generate` refuses to run inside. SignalError on entering for hooks that are not
        a list of (target, fn) pairs or a bad target.
        """
        return hooks(self, signals, fwd_hooks, bwd_hooks)

    def add_hook(self, name: Any, hook: HookFn, dir: Literal["fwd", "bwd"] = "fwd") -> None:
        """Keep a hook function on for every later hooked forward, until :meth:`reset_hooks` (TransformerLens's ``add_hook``).

        name: an activation name, short form, predicate or list of them; hook:
        ``fn(activation, hook)`` ("fwd") or ``fn(grad, hook)`` ("bwd"). It applies in
        :meth:`run_with_cache`, :meth:`run_with_hooks`, :meth:`gradients`, patches and
        :meth:`logits` / :meth:`probs` (which then run one hooked forward instead of the
        engine), each time bound to that call's signals, before the call's own hooks; a
        backward hook fires in forwards that keep the graph (:meth:`run_with_hooks` keeps it
        while one is added). :meth:`generate` refuses to run while any is added.
        Nothing sits on the model between calls: :func:`contllm.internals.binding.add_hook`.
        """
        add_hook(self, name, hook, dir)

    def reset_hooks(self) -> None:
        """Remove every hook added with :meth:`add_hook` (TransformerLens's ``reset_hooks``)."""
        reset_hooks(self)

    def gradients(
        self,
        signals: Signal | Sequence[Signal],
        readout: Callable[[torch.Tensor], torch.Tensor],
        *,
        positions: Positions = "last",
        wrt: Any = ("durations", "embeds"),
        tokens: Positions | None = None,
    ) -> Gradients:
        """Gradients of ``readout(logits)`` by durations, input embeddings and activations: :func:`contllm.internals.gradients.gradients`.

        readout maps the batch's logits ([batch, vocab] at the last position by default) to
        one value per signal; wrt lists "durations", "embeds" and activation names; tokens
        picks the tokens whose durations and embeddings are asked for (None: all; those
        after a prefix the signals share cost one forward and backward of the rest).
        SignalError for a readout that is not callable or returns anything but float values
        with a gradient, one per signal, a ``wrt`` that is no name (a number, None), or a
        signal :meth:`logits` would refuse.
        """
        return gradients(self, signals, readout, positions=positions, wrt=wrt, tokens=tokens)

    def trace(self, signals: Signal | Sequence[Signal], *, grad: bool = False, **options: Any) -> Any:
        """nnsight's tracer over ``signals``: :func:`contllm.internals.interop.trace` (needs ``contllm[nnsight]``).

        ``with lm.trace(signals) as tr:`` then ``tr.model.model.layers[5].output.save()``,
        ``tr.model.output.logits``, and ``tr.columns(-1)`` for each row's last token.
        SignalError for a signal :meth:`logits` would refuse whatever it reads (every duration
        0, durations or times edited in place to values a signal cannot hold).
        """
        return trace(self, signals, grad=grad, **options)

    def forward_kwargs(self, signals: Signal | Sequence[Signal]) -> ForwardInputs:
        """Keyword arguments that run ``signals`` through the stock forward: :func:`contllm.internals.interop.forward_kwargs`.

        ``self.model(**inputs)`` inside ``inputs.context()`` gives this model's logits on the
        left-padded batch (input embeddings, the continuous-time 4D mask and float position
        ids); for nnsight, baukit or hooks of one's own. The module docstring of
        :mod:`contllm.internals.interop` lists the caveats.
        """
        return forward_kwargs(self, signals)

    # ------------------------------------------------------------------ generation
    def generate(
        self, signals: Signal | Sequence[Signal], max_new_tokens: int = 20, **options: Any
    ) -> Generation | list[Generation]:
        """Continue ``signals`` through the KV cache: :func:`contllm.generation.generate` (its options, by keyword).

        A single Signal gives one :class:`~contllm.generation.Generation`, a list a list.
        Greedy by default; ``duration`` sets each new token's duration; ``sample=True``
        draws with temperature, top_k, top_p and seed; stop, stop_at_eos end a row; probs
        asks for each step's top-k or "full" distribution, activations for named
        activations per step. max_new_tokens is at most :data:`contllm.generation.MAX_NEW_TOKENS`.
        SignalError for an unknown option, naming the known ones, and while named hooks are on
        (inside :meth:`hooks` or after :meth:`add_hook`): generation runs none.
        """
        if hooks_on(self):
            raise SignalError(
                "generate runs no named hooks: leave lm.hooks(...) and call lm.reset_hooks() first, or read "
                "hooked continuations step by step with lm.run_with_hooks"
            )
        known = GENERATE_OPTIONS
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise SignalError(f"generate() got unknown option(s) {', '.join(unknown)}; options: {', '.join(known)}")
        return generate(self, signals, max_new_tokens, **options)


def wrap(model: Any, tokenizer: Any = None, info: Any = None) -> ContinuousLM:
    """A model and tokenizer you already hold, ready for continuous inputs: the same API as :func:`contllm.load`.

    model: a transformers causal LM of a supported family (eager or sdpa attention);
    it is put in eval mode (dropout would make every output random) and otherwise left
    as it is. tokenizer: its tokenizer, or None. Raises UnsupportedModelError naming the
    supported families or attention implementations.
    """
    if not isinstance(model, torch.nn.Module):
        raise UnsupportedModelError(
            f"wrap() needs a transformers model (a torch.nn.Module), got {type(model).__name__}"
        )
    lm = ContinuousLM(model, tokenizer, info)
    model.eval()
    return lm
