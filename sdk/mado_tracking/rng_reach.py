"""Was an RNG re-seeded after its state was restored, or did it only draw numbers?
(docs/design/checkpoints.md#restore-check)

The restore check compares an RNG's state at the first metrics of a resumed
run (``now``) with the state ``load_checkpoint`` restored (``restored``). Both
differ as soon as the first step drew a number, so equality proves nothing;
what does is whether drawing from ``restored`` can lead to ``now``.

Python's ``random``, NumPy's global generator and torch's CPU generators are
Mersenne Twisters: 624 words and a position; drawing moves the position and,
every 624 words, replaces the words by their "twist". ``now`` is reachable
from ``restored`` when its words are ``restored``'s (at a position not before
it) or those of one of the next twists; ``mt_reaches`` looks up to
``LIMIT_WORDS`` draws ahead (using Python's own generator to twist, 624 words
at a time). A freshly seeded generator has a recognisable first word (seeding
by array sets it to 0x80000000; seeding by an integer fills the words with a
known recurrence), which gives a re-seed away even when nothing can be said
from the draws. torch's CPU generator also keeps the seed it was last given,
so a generator seeded again is found from that seed. CUDA generators (Philox)
are a seed and an offset that only grows while drawing.
"""

import struct
from dataclasses import dataclass

MT_WORDS = 624
LIMIT_WORDS = 1 << 23  # draws looked ahead, once per RNG of a resumed run (its cost: docs/deploy.md, "Measured")
_WORD_BYTES = 4
_ARRAY_SEED_FIRST_WORD = 0x80000000
_TORCH_CPU_STATE_BYTES = 5056
_TORCH_KEY_OFFSET = 24


@dataclass(frozen=True)
class MtState:
    """A Mersenne Twister state: ``key`` (624 ints < 2**32), ``pos`` (0..624; 624: the next draw twists) and, for
    torch's generators, ``seed`` (the seed it was last given; None otherwise)."""

    key: tuple
    pos: int
    seed: int | None = None


def mt_from_python(state) -> MtState:
    """``random.getstate()`` as an ``MtState``."""
    _version, internal, _gauss = state
    return MtState(key=tuple(internal[:MT_WORDS]), pos=int(internal[MT_WORDS]))


def mt_from_numpy(state: dict) -> MtState:
    """``numpy.random.get_state(legacy=False)`` as an ``MtState``."""
    return MtState(key=tuple(int(word) for word in state["state"]["key"]), pos=int(state["state"]["pos"]))


def mt_from_torch(state: bytes) -> MtState | None:
    """The bytes of a torch CPU generator's ``get_state()`` as an ``MtState``; None when their layout is not the one
    this module knows (checked once against a generator seeded here)."""
    if len(state) != _TORCH_CPU_STATE_BYTES or not _torch_layout_known():
        return None
    return _parse_torch(state)


def _parse_torch(state: bytes) -> MtState:
    seed, left, _seeded, _next = struct.unpack_from("<QiiQ", state, 0)
    words = struct.unpack_from(f"<{MT_WORDS}Q", state, _TORCH_KEY_OFFSET)
    return MtState(key=tuple(word & 0xFFFFFFFF for word in words), pos=MT_WORDS + 1 - left, seed=seed)


_layout_checked: bool | None = None


def _torch_layout_known() -> bool:
    global _layout_checked
    if _layout_checked is None:
        import torch

        generator = torch.Generator().manual_seed(5489)
        fresh = _parse_torch(bytes(generator.get_state().tolist()))
        torch.randint(0, 2**31, (1,), generator=generator)
        drawn = _parse_torch(bytes(generator.get_state().tolist()))
        _layout_checked = (
            fresh.seed == 5489
            and fresh.pos == MT_WORDS
            and fresh.key[:2] == (5489, (1812433253 * (5489 ^ (5489 >> 30)) + 1) & 0xFFFFFFFF)
            and drawn.key == _twist(fresh.key)
            and 1 <= drawn.pos < MT_WORDS
        )
    return _layout_checked


def torch_fresh(seed: int) -> MtState | None:
    """The state of a torch CPU generator just seeded with ``seed`` (None: unknown layout)."""
    import torch

    return mt_from_torch(bytes(torch.Generator().manual_seed(seed).get_state().tolist()))


def _twist(key: tuple) -> tuple:
    import random

    twister = random.Random()
    twister.setstate((3, (*key, MT_WORDS), None))
    twister.getrandbits(32)
    return twister.getstate()[1][:MT_WORDS]


def _temper(word: int) -> int:
    word ^= word >> 11
    word ^= (word << 7) & 0x9D2C5680
    word ^= (word << 15) & 0xEFC60000
    return word ^ (word >> 18)


def mt_reaches(start: MtState, now: MtState, limit: int = LIMIT_WORDS) -> bool | None:
    """True when drawing from ``start`` leads to ``now`` within about ``limit`` numbers, False when it cannot
    (the same words at an earlier position), None when not found within ``limit``."""
    if now.key == start.key:
        return now.pos >= start.pos
    import random

    twister = random.Random()
    twister.setstate((3, (*start.key, MT_WORDS), None))
    # Outputs are the tempered words; 624 of them, aligned on a twist, are that twist's words.
    pattern = b"".join(struct.pack("<I", _temper(word)) for word in now.key)
    chunk = MT_WORDS * _WORD_BYTES
    drawn, twists = 0, 64
    while drawn < limit:
        data = twister.getrandbits(32 * MT_WORDS * twists).to_bytes(chunk * twists, "little")
        found = data.find(pattern)
        while found >= 0:
            if found % chunk == 0:
                return True
            found = data.find(pattern, found + 1)
        drawn += MT_WORDS * twists
        twists = min(twists * 2, 4096)
    return None


def freshly_seeded(state: MtState) -> bool:
    """True when ``state`` is a Mersenne Twister seeded and not drawn from beyond its first 624 numbers."""
    key = state.key
    if key[0] == _ARRAY_SEED_FIRST_WORD:
        return True
    return all(key[i] == (1812433253 * (key[i - 1] ^ (key[i - 1] >> 30)) + i) & 0xFFFFFFFF for i in range(1, 8))


def philox(state: bytes) -> tuple[int, int] | None:
    """``(seed, offset)`` of a CUDA generator's ``get_state()`` bytes; None for another layout."""
    if len(state) != 16:
        return None
    return struct.unpack("<QQ", state)


def verdict(kind: str, restored, now) -> tuple[str, str]:
    """``("restored" | "not_restored" | "unknown", detail)`` for one RNG.

    ``kind``: ``"mt"`` (``restored`` / ``now`` are ``MtState``; a torch
    generator's carry its ``seed``) or ``"philox"`` (``(seed, offset)``).
    """
    if restored is None or now is None:
        return "unknown", "its state is in a form this check does not read"
    if kind == "philox":
        if now[0] != restored[0]:
            return "not_restored", f"seeded with {now[0]} after load (the checkpoint's was seeded with {restored[0]})"
        if now[1] < restored[1]:
            return "not_restored", "re-seeded or set back after load (its offset is below the checkpoint's)"
        return "restored", ""
    reached = mt_reaches(restored, now)
    if reached:
        return "restored", ""
    if now.seed is not None:
        fresh = torch_fresh(now.seed)
        if fresh is not None and mt_reaches(fresh, now):
            return "not_restored", f"re-seeded with {now.seed} after load"
        if now.seed != restored.seed:
            return (
                "not_restored",
                f"seeded with {now.seed} after load (the checkpoint's was seeded with {restored.seed})",
            )
    if reached is False or freshly_seeded(now):
        return "not_restored", "re-seeded or set after load"
    return "unknown", f"moved more than {LIMIT_WORDS:,} draws away from the restored state: not checked"
