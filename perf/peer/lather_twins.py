"""What the PyTorch twins of lather-train's models (perf/peer/transformer.py, perf/peer/mlp.py)
share: Lather's random engine, its learning-rate schedule, and reading a Lather checkpoint."""

import math
import os
import subprocess
import tempfile

import numpy as np

MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64: seeding and outputs fixed by the C++ standard; the twist vectorised."""

    N, M = 312, 156
    UPPER, LOWER = np.uint64(0xFFFFFFFF80000000), np.uint64(0x7FFFFFFF)
    MATRIX_A = np.uint64(0xB5026F5AA96619E9)

    def __init__(self, seed):
        state = [seed & MASK64]
        for i in range(1, self.N):
            previous = state[-1]
            state.append((6364136223846793005 * (previous ^ (previous >> 62)) + i) & MASK64)
        self.mt = np.array(state, dtype=np.uint64)
        self.block = np.empty(0, dtype=np.uint64)  # tempered words not yet handed out
        self.at = 0

    def _twist(self):
        mt, n, m, one = self.mt, self.N, self.M, np.uint64(1)
        # i in [0, n - m): mt[i + 1] and mt[i + m] are still the old words.
        y = (mt[0:n - m] & self.UPPER) | (mt[1:n - m + 1] & self.LOWER)
        mt[0:n - m] = mt[m:n] ^ (y >> one) ^ ((y & one) * self.MATRIX_A)
        # i in [n - m, n - 1): mt[i + 1] old, mt[i + m - n] already new.
        y = (mt[n - m:n - 1] & self.UPPER) | (mt[n - m + 1:n] & self.LOWER)
        mt[n - m:n - 1] = mt[0:m - 1] ^ (y >> one) ^ ((y & one) * self.MATRIX_A)
        # i = n - 1: mt[0] and mt[m - 1] new.
        y = (mt[n - 1] & self.UPPER) | (mt[0] & self.LOWER)
        mt[n - 1] = mt[m - 1] ^ (y >> one) ^ ((y & one) * self.MATRIX_A)
        z = mt.copy()
        z ^= (z >> np.uint64(29)) & np.uint64(0x5555555555555555)
        z ^= (z << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        z ^= (z << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        z ^= z >> np.uint64(43)
        self.block, self.at = z, 0

    def words(self, count):
        """The next `count` outputs as a uint64 array."""
        out = np.empty(count, dtype=np.uint64)
        done = 0
        while done < count:
            if self.at == len(self.block):
                self._twist()
            grab = min(count - done, len(self.block) - self.at)
            out[done:done + grab] = self.block[self.at:self.at + grab]
            self.at += grab
            done += grab
        return out

    def __call__(self):
        return int(self.words(1)[0])

    def take(self, count):
        """The next `count` outputs as Python ints."""
        return self.words(count).tolist()


def check_mt19937_64():
    """The C++ standard's check ([rand.predef]): the 10000th output of mt19937_64 seeded 5489."""
    value = int(MT19937_64(5489).words(10000)[-1])
    if value != 9981545732273789042:
        raise RuntimeError(f"MT19937_64 is wrong: 10000th output {value}")


def learning_rate(kind, peak, warmup, decay_steps, step):
    """optim::LearningRateSchedule::operator() with end_value 0."""
    step = max(step, 0)
    if kind != "constant" and warmup > 0 and step < warmup:
        return peak * step / warmup
    after = step - max(0, warmup)
    if kind in ("constant", "warmup"):
        return peak
    t = min(1.0, after / decay_steps) if decay_steps > 0 else 1.0
    if kind == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * t))
    if kind == "linear":
        return peak - peak * t
    if kind == "rsqrt":
        w = float(max(1, warmup))
        return peak * math.sqrt(w / max(float(step), w))
    raise ValueError(kind)


def h5dump_dataset(checkpoint, dataset, count):
    """A float32 dataset of a Lather checkpoint, by Debian's h5dump (h5py is not in the environment)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "data.bin")
        subprocess.run(["h5dump", "-d", dataset, "-b", "LE", "-o", out, checkpoint], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        data = np.fromfile(out, dtype="<f4")
    if data.size != count:
        raise RuntimeError(f"{checkpoint}:{dataset} holds {data.size} values, expected {count}")
    return data
