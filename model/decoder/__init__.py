"""The masked-diffusion decoders: fill a hole between a prefix and a suffix, in token ids.

The package, cut along the stages of a decode (each module's doc says what it owns):

* :mod:`.spec` -- the rules (``SamplerConfig``), the special ids, ``StepSpec``, the answers;
* :mod:`.canvas` -- the canvas, a batch of them, the loop's state;
* :mod:`.step` -- one refinement step (``denoise_step``) and draft verification;
* :mod:`.loop` -- THE decode loop (``run_steps``), its rows and steppers, the candidates;
* :mod:`.reference` -- the slow reference the loop is held to;
* :mod:`.dreamon` -- the second decoder: DreamOn's expand/delete length control, whose hole
  grows and shrinks between steps (its doc says what it shares with the loop and why not
  the rest).

The rules below are the first decoder's (DreamOn's differences: :mod:`.dreamon`).

Canvas
------
For every candidate hole length ``n`` the sampler builds::

    start prefix [MASK]*n suffix end

where ``start`` / ``end`` and the tokens that end a middle come from the family's
recipe (``cfg.recipe``, :mod:`diffill.model.recipes`: e.g. Dream's tokenizer BOS and
EOS, nothing for Open-dCoder, ``<|startoftext|>``/``<|endoftext|>`` for LLaDA); without
a recipe ``start`` = [BOS] (none when ``cfg.bos_token_id`` is None) and ``end`` = [EOS].
For a ``shift_logits`` model with neither ``start`` nor prefix, the recipe's lead token
(EOS) is put first so that slot 0 has a position ``i - 1`` to be read from. All candidate lengths are
right-padded into ONE batch ``[L, T_max]`` with a key-padding attention mask and
run in one forward per step. The LM head runs only at the ``N = max(n)`` hole
slots of each row (``[L, N, D] -> [L, N, V]``), never over the whole canvas
(slots already committed are computed too and ignored: static shapes keep the
step compilable and graph-capturable, and cost at most ``L * N`` head rows);
for ``cfg.shift_logits`` models the logit for slot position ``p`` is read from
hidden state ``p - 1``. The mask id is never predicted (its logit is -inf).

Refinement (one call to :func:`.step.denoise_step` per step)
------------------------------------------------------
Each step predicts a token for every still-masked slot (argmax at temperature
0, Gumbel-max sampling from ``softmax(logits / T)`` otherwise) and a score, the
higher the more confident:

* ``CONFIDENCE``: probability of the predicted token;
* ``MARGIN``: top-1 minus top-2 probability;
* ``ENTROPY``: ``exp(-H(p))`` -- an order-preserving map of "lower entropy is
  better" onto ``(0, 1]`` so that one ``threshold`` scale works for all three.

(At temperature > 0 the probabilities are those of the tempered distribution.)
With ``steps_left`` steps to go and ``rem`` slots still masked, a row commits
its ``k`` best slots (ties: lower slot index first), where::

    fixed mode:      k = ceil(rem / steps_left)
    threshold mode:  k = max(ceil(rem / steps_left), #{slots with score > threshold})

So fixed mode unmasks everything by the last step; threshold mode is
Fast-dLLM's parallel decoding (the best slot plus all slots above the
threshold) with the fixed schedule as a floor, which makes ``steps`` a hard
upper bound. The threshold loop stops as soon as nothing is masked (the only
host synchronisation inside the loop, in :func:`.loop.run_steps`). The fixed loop runs
``min(steps, N)`` steps and never synchronises.

Semi-autoregressive blocks (``SamplerConfig.block``)
---------------------------------------------------
With ``block = B`` the hole of a row with ``n`` slots is cut into ``nb = ceil(n / B)``
blocks decoded left to right, as in LLaDA's semi-autoregressive remasking. The
``S`` steps of the loop are shared out among the blocks: at step ``s`` (0-based) the
slots of blocks ``0 .. C`` are eligible, ``C = ceil((s + 1) nb / S) - 1``, and they
must all be committed by the end of step ``floor((C + 1) S / nb) - 1``; so with
``d = floor((C + 1) S / nb) - s`` steps left before that deadline and ``r`` eligible
slots still masked, the row commits ``k = ceil(r / d)`` of them (the best by score;
threshold mode adds every eligible slot above the threshold). With ``S >= nb`` each
block gets ``S / nb`` steps (rounded); with ``S < nb`` one step covers several blocks.
``S`` is the number of steps the row's loop runs (``min(steps, n)`` in fixed mode).
When the eligible blocks are all committed before their deadline (threshold mode),
the block of the first masked slot becomes eligible at once.

Why: pad absorption plus confidence ordering lets a weak model end the middle from
the right. The far slots of a loose hole are almost surely pad, so they are the most
confident and are committed first; every pad committed makes its left neighbour's pad
more likely, and the end of the middle walks left until only the indentation is left
(measured on the shipped model: 81 of 104 HumanEval lines came back empty or
indentation-only with 16 slots and 8 steps; with ``block = 4``, 9). Inside a block the
order is still chosen by confidence. ``block = None`` (the default here; a checkpoint
may recommend one in its config, ``decode_block``, which the engine's default sampler
uses) is plain any-order decoding, exactly as before blocks existed.

Length handling
---------------
Training fills a hole of ``n`` slots holding an ``m``-token middle with the
middle followed by ``n - m`` pads. Accordingly:

* the middle returned is the hole up to (not including) the first pad/EOS;
* **pad absorption** (``SamplerConfig.absorb_pad``, default on): as soon as a
  pad/EOS is committed at slot ``j``, every slot after ``j`` becomes a committed
  pad, including slots committed earlier. The canvas the model sees next then
  has the training shape (middle, then pads only), later steps spend no work
  on tokens that trimming would throw away, and the threshold loop ends sooner.
  With it off, slots after the first pad keep being decoded and are trimmed at
  the end (the returned middle is defined the same way in both cases).

Ranking score (``Infill.score``)
--------------------------------
Each committed slot records ``log p(token)`` under the model's *untempered*
distribution at the step it was unmasked. The score of a candidate is the mean
of these values over the returned middle tokens plus the terminator (the first
pad/EOS) when the hole contains one, i.e. over ``m + 1`` slots (``n`` slots for
a hole filled to the brim). Why this one:

* Commit-time log-probs are free (computed by the step anyway) and their sum is
  the model's log-likelihood of the filling in the order it was decoded (an
  any-order autoregressive factorisation; approximate when several slots are
  committed in one step). Re-scoring the final middle instead would need one
  forward per middle token with that token masked (a masked-diffusion model
  cannot score a token it sees), far too slow for an editor.
* The terminator's log-prob is where the length decision is made: "the middle
  ends here" is what distinguishes a good length from a truncated one.
* The pads after the terminator are left out: they are forced by absorption
  (and nearly certain without it), so counting them would reward long holes
  for padding alone -- with ``n = 32`` and a 5-token middle, 26 near-zero terms
  would drown the evidence. Averaging over ``m + 1`` makes candidates with
  different ``n`` comparable: the same middle reached from two lengths gets
  (nearly) the same score, whatever ``n`` was.

Known bias: a hole filled to the brim has no terminator term (there is no slot
left to say "the middle ends here"), so it misses the one term that is usually
below average; a too-short hole is still ranked down when, as usual, the model
is less sure of the squeezed tokens themselves.

Results come back best first (ties: order of ``SamplerConfig.lengths``).
Candidates whose trimmed middle is identical to a better-ranked one are
dropped unless ``dedup=False`` is passed, so fewer than ``len(lengths)``
results may be returned.

The decode loop
---------------
One loop, :func:`.loop.run_steps`, serves :func:`.loop.infill`, the dual-cache sampler
(:func:`diffill.model.cache.infill_cached`) and the engine's batches
(:class:`diffill.model.engine.Engine`, several requests per batch, CUDA graphs):

* :class:`.spec.StepSpec` bundles what every step of a batch shares (special ids, logit shift,
  strategy, threshold, temperature, pad absorption, blocks, step count, selection
  kernel); :func:`.step.denoise_step` is ``(model, canvas, state, steps_left, spec, noise)``.
* :class:`.loop.Rows` keeps each canvas row's request, hole length and noise generator in
  step with the canvas when a cancelled request's rows go.
* a :class:`.loop.Stepper` runs a step and lets rows go: :class:`.loop.EagerSteps` (the torch step on
  the model, or on a cache wrapper), the engine's CUDA-graph replay (static buffers; it
  freezes rows instead of dropping them).
* :func:`.loop.collect` turns the final state into each request's ranked candidates.

A family's own terminators and filler token come in through :meth:`.spec.StepSpec.of`'s
``special``. A decoder whose hole grows or shrinks between steps is the second decoder,
:mod:`.dreamon`.

Drafts (draft and verify)
-------------------------
A request may carry *drafts*: candidate middles (token ids) proposed by something cheaper
than the model -- text copied from elsewhere in the buffer, a rule, an earlier suggestion
(:mod:`diffill.lsp_server.drafts` proposes them). Each draft ``d`` of ``m`` tokens gets one
more row in the same batch, of the longest candidate length ``n >= m + 1``, all masked like
any other row. Step 0 is also the draft's *verification*: from that one forward, slot
``j < m`` agrees with the draft when ``log p(d_j) >= log p(top_j) + log(draft_ratio)``
(``SamplerConfig.draft_ratio``; ``p`` the untempered marginal of the all-masked slot,
``top_j`` its likeliest token), and slot ``m`` agrees when the likeliest terminator clears
the same bar (the model must also accept that the middle ends there). The *accepted run* is
the agreeing slots from slot 0 to the first one that disagrees; those slots are committed
with the draft's tokens (slot ``m`` with that terminator), on top of what the step's normal
selection commits in that row, and the row goes on as any other. So:

* a draft accepted with its end (run ``m + 1``) is *verified*: its row is complete after one
  step. The loop reads the draft rows' outcome once after step 0 (one host sync), and a
  request with as many verified drafts as it wants (``InfillRequest.wanted``, 1 for an
  editor's ghost text; the engine asks for its ``candidates``) is finished there: its other
  rows are let go and it is answered by its verified drafts (``Infill.verified``,
  ``steps == 1``), ranked by score. Otherwise the verified drafts wait for the rest and
  everything is ranked together by score.
* a partly accepted draft keeps its accepted run and the rest is denoised as usual, so it
  needs fewer steps of its own;
* a rejected draft costs its row in the batch and nothing else.

Why this rule. A masked-diffusion model cannot score a token it sees, so checking a draft
the way an autoregressive model does (one position at a time, each seeing the ones
before) would take ``m`` forwards; all slots masked, one forward gives the marginal of
every slot at once. The bar is relative to the slot's top token (a draft token that is the
model's own first choice always passes, whatever the entropy), the run is from the hole's
start (a later token agreeing after an earlier one disagreed is not evidence for the
draft) and the end must pass too (otherwise a draft that is right but incomplete would be
committed as the whole middle). ``draft_ratio`` = 1 accepts only the model's own argmax;
small values accept what the model merely finds plausible: the candidates are then ranked
by the same score as every other candidate, so the model still chooses *between* drafts.
The checkpoint may set it (``draft_ratio`` in a diffill config.json; the shipped model's
value and why: BENCHMARKS.md, *Draft and verify*). Scores stay comparable: the committed
draft tokens record their verification-step log-probs, exactly as slots the model commits
itself. :func:`.reference.infill_reference` verifies each draft alone, step by step, with the same
rule; the tests hold the batched path to it.

Randomness
----------
Sampling noise is drawn per candidate from a generator seeded with
``(seed, n)`` (``n`` the hole length), one ``[n, V]`` uniform draw per step.
So a candidate's result does not depend on which other lengths share the batch,
the same seed reproduces the same result, and :func:`.reference.infill_reference`
reproduces the fast path token for token even at temperature > 0.
"""
