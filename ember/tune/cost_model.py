"""The learned cost model: which candidates are worth measuring.

A gradient-boosted regression (LightGBM) of a candidate's speed relative to its kernel's
default schedule -- ``log2(default time / candidate time)`` -- on the features of its scheduled
loop IR (:mod:`ember.tune.features`).  Relative speed is comparable across kernels of every
size, so one model ranks the candidates of any kernel, and a model trained on other kernels
(the pretrained one that ships with ember, ``cost_model.txt`` beside this file) transfers to
a new one.  The tuner retrains it on its own measurements as they arrive and measures the
candidates it ranks highest; :func:`ranking_quality` says how well it ranks measurements it
was not trained on.

LightGBM is an optional dependency (``pip install 'ember[tune]'``): without it, the tuner
searches without a model (every proposal measured in random order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ember.tune.features import FEATURE_NAMES

PRETRAINED_FILE = Path(__file__).with_name("cost_model.txt")
# LightGBM settings for the few hundred samples of one tuning run.
PARAMS = {"objective": "regression", "learning_rate": 0.1, "num_leaves": 15,
          "min_data_in_leaf": 3, "feature_fraction": 0.9, "bagging_fraction": 0.9,
          "bagging_freq": 1, "verbose": -1, "num_threads": 1, "seed": 0,
          "deterministic": True}
ROUNDS = 120


def available() -> bool:
    """Whether LightGBM is installed."""
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        return False
    return True


class CostModel:
    """Predicts ``log2(default time / time)`` from feature vectors (higher: faster)."""

    def __init__(self, booster=None):
        self.booster = booster

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def fit(self, features: np.ndarray, speedups: np.ndarray,
            start: "CostModel | None" = None) -> "CostModel":
        """Train on ``features`` (n x FEATURE_NAMES) and log2 speedups; ``start`` (e.g. the
        pretrained model) is continued rather than replaced."""
        import lightgbm

        data = lightgbm.Dataset(np.asarray(features, dtype=np.float64),
                                np.asarray(speedups, dtype=np.float64),
                                feature_name=list(FEATURE_NAMES), free_raw_data=False)
        self.booster = lightgbm.train(PARAMS, data, num_boost_round=ROUNDS,
                                      init_model=start.booster if start and start.trained
                                      else None)
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return np.zeros(len(features))
        return self.booster.predict(np.asarray(features, dtype=np.float64))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if self.booster is None:
            raise ValueError("an untrained cost model cannot be saved")
        self.booster.save_model(str(path))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        import lightgbm

        booster = lightgbm.Booster(model_file=str(path))
        if list(booster.feature_name()) != list(FEATURE_NAMES):
            raise ValueError(f"cost model {path} was trained on other features "
                             f"({len(booster.feature_name())}); train it again with "
                             f"tools/train_cost_model.py")
        return cls(booster)

    @classmethod
    def pretrained(cls) -> "CostModel | None":
        """The model that ships with ember, or None (no LightGBM, or no file)."""
        if not available() or not PRETRAINED_FILE.is_file():
            return None
        try:
            return cls.load(PRETRAINED_FILE)
        except ValueError:
            return None


def ranking_quality(predicted: Sequence[float], measured: Sequence[float],
                    groups: Sequence[str], top: int = 5) -> dict[str, float]:
    """How well ``predicted`` scores order ``measured`` speedups within each group (kernel):
    the share of pairs of one group the prediction orders as measured (ties of the measured
    speedup within 1 % left out), and the share of each group's truly fastest candidate found
    among the ``top`` predicted (top-k recall of the best), averaged over groups of 2+."""
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    agree = pairs = 0
    recalls = []
    for group in sorted(set(groups)):
        index = np.array([i for i, g in enumerate(groups) if g == group])
        if len(index) < 2:
            continue
        p, m = predicted[index], measured[index]
        for i in range(len(index)):
            for j in range(i + 1, len(index)):
                if abs(m[i] - m[j]) < np.log2(1.01):
                    continue
                pairs += 1
                agree += (p[i] - p[j]) * (m[i] - m[j]) > 0
        best = int(np.argmax(m))
        recalls.append(float(best in np.argsort(-p, kind="stable")[:top]))
    return {"pairwise_accuracy": agree / pairs if pairs else float("nan"),
            f"top{top}_recall": float(np.mean(recalls)) if recalls else float("nan"),
            "pairs": float(pairs), "groups": float(len(recalls))}
