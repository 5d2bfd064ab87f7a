"""Drawing from a restored RNG is told apart from seeding it again (docs/design/checkpoints.md#restore-check)."""

import random
import struct

import numpy as np
import torch

from mado_tracking import rng_reach


def _torch(generator: torch.Generator) -> rng_reach.MtState:
    return rng_reach.mt_from_torch(bytes(generator.get_state().tolist()))


def test_pythons_generator_reached_by_drawing_is_restored_and_set_back_is_not():
    twister = random.Random(3)
    restored = rng_reach.mt_from_python(twister.getstate())
    twister.getrandbits(32 * 624 * 10 + 5)  # ten twists and some
    assert rng_reach.verdict("mt", restored, rng_reach.mt_from_python(twister.getstate())) == ("restored", "")
    assert rng_reach.mt_reaches(rng_reach.mt_from_python(twister.getstate()), restored, limit=624 * 100) is None
    back = random.Random(3)
    back.setstate(twister.getstate())
    later = rng_reach.mt_from_python(back.getstate())
    back.getrandbits(32)
    ahead = rng_reach.mt_from_python(back.getstate())
    assert rng_reach.mt_reaches(ahead, later) is False  # same words, an earlier position
    assert rng_reach.verdict("mt", ahead, later)[0] == "not_restored"


def test_a_freshly_seeded_python_or_numpy_generator_is_named_re_seeded():
    twister = random.Random(1)
    twister.getrandbits(32 * 624 * 3)
    restored = rng_reach.mt_from_python(twister.getstate())
    assert rng_reach.verdict("mt", restored, rng_reach.mt_from_python(random.Random(1).getstate())) == (
        "not_restored",
        "re-seeded or set after load",
    )
    legacy = np.random.RandomState(0)
    legacy.random_sample(5000)
    drawn = rng_reach.mt_from_numpy(legacy.get_state(legacy=False))
    fresh = rng_reach.mt_from_numpy(np.random.RandomState(0).get_state(legacy=False))
    assert rng_reach.verdict("mt", drawn, fresh)[0] == "not_restored"
    legacy.random_sample(100)
    assert rng_reach.verdict("mt", drawn, rng_reach.mt_from_numpy(legacy.get_state(legacy=False)))[0] == "restored"


def test_torch_generators_say_the_seed_they_were_given_again():
    generator = torch.Generator().manual_seed(7)
    torch.rand(20000, generator=generator)
    restored = _torch(generator)
    torch.randperm(1797, generator=generator)
    assert rng_reach.verdict("mt", restored, _torch(generator)) == ("restored", "")
    generator.manual_seed(7)
    torch.rand(10, generator=generator)
    assert rng_reach.verdict("mt", restored, _torch(generator)) == ("not_restored", "re-seeded with 7 after load")
    generator.manual_seed(8)
    assert rng_reach.verdict("mt", restored, _torch(generator)) == ("not_restored", "re-seeded with 8 after load")


def test_the_torch_state_layout_is_checked_and_another_is_unknown():
    assert rng_reach._torch_layout_known()
    assert rng_reach.mt_from_torch(b"\0" * 100) is None
    assert rng_reach.verdict("mt", None, None)[0] == "unknown"


def test_cuda_philox_states_move_forward_only():
    def state(seed, offset):
        return rng_reach.philox(struct.pack("<QQ", seed, offset))

    assert rng_reach.verdict("philox", state(5, 100), state(5, 164)) == ("restored", "")
    assert rng_reach.verdict("philox", state(5, 100), state(5, 4))[0] == "not_restored"
    assert "seeded with 6" in rng_reach.verdict("philox", state(5, 100), state(6, 200))[1]
    assert rng_reach.philox(b"\0" * 15) is None
