"""The flat keys of earlier versions (``aggregation.balance_gamma``, ``attack.std``, ...): where each
now lives, how a value given with one is set, and a section written as earlier versions wrote
it (what a run's identity is computed from, so that finished runs keep their identity)."""

from __future__ import annotations
from collections.abc import Mapping, Sequence
from typing import Any
from dfedrw.peer.config.tables import Params, SettingsTables, default_of, thaw, toml_value


# Old flat key -> (kind, class name, setting) where it now lives, in the old [aggregation] and
# [attack] tables' order; a value spelled as in LEGACY_UNSET means the class's default (None).
LEGACY: dict[str, tuple[str, str, str]] = {
    "aggregation.temperature": ("crs", "softmax", "temperature"),
    "aggregation.accuracy_scale": ("crs", "softmax", "scale"),
    "aggregation.loss_clip_weighting": ("crs", "loss_clip_mean", "weighting"),
    "aggregation.clip_threshold": ("crs", "clip", "threshold"),
    "aggregation.tpm_accuracy_weight": ("tpm", "combined", "accuracy"),
    "aggregation.tpm_loss_weight": ("tpm", "combined", "loss"),
    "aggregation.dfedavg_weighting": ("rule", "dfedavg", "weighting"),
    "aggregation.multi_krum_m": ("rule", "multi_krum", "m"),
    "aggregation.flame_noise": ("rule", "flame", "noise"),
    "aggregation.flame_cluster_on": ("rule", "flame", "cluster_on"),
    "aggregation.balance_gamma": ("rule", "balance", "gamma"),
    "aggregation.balance_kappa": ("rule", "balance", "kappa"),
    "aggregation.balance_alpha": ("rule", "balance", "alpha"),
    "aggregation.q": ("rule", "qfdfl", "q"),
    "attack.std": ("attack", "gaussian", "std"),
    "attack.center": ("attack", "gaussian", "center"),
    "attack.scale": ("attack", "sign_flip", "scale"),
    "attack.z": ("attack", "alie", "z"),
}


LEGACY_UNSET = {"aggregation.multi_krum_m": 0, "attack.z": "auto"}


# Where assumed_byzantine stood among the old [aggregation] keys (identity order).
LEGACY_AGGREGATION_ORDER = (
    "temperature", "accuracy_scale", "loss_clip_weighting", "clip_threshold", "tpm_accuracy_weight",
    "tpm_loss_weight", "dfedavg_weighting", "assumed_byzantine", "multi_krum_m", "flame_noise",
    "flame_cluster_on", "balance_gamma", "balance_kappa", "balance_alpha", "q",
)


def legacy_view(section: str, head: dict[str, Any], order: Sequence[str], tables: Mapping[str, Params]) -> dict[str, Any]:
    """A section as earlier versions wrote it: ``head``, then every flat key of :data:`LEGACY`
    (``order``) with its value or the class's default, then the settings tables that have no
    flat key (nested, as in the new form)."""
    thawed = {kind: thaw(p) for kind, p in tables.items()}
    out = dict(head)
    for key in order:
        if f"{section}.{key}" not in LEGACY:
            continue
        kind, name, setting = LEGACY[f"{section}.{key}"]
        table = thawed.get(kind, {}).get(name, {})
        value = table.pop(setting, default_of(kind, name, setting))
        out[key] = LEGACY_UNSET[f"{section}.{key}"] if value is None else toml_value(value)
    for kind, by_name in thawed.items():
        nested = {n: {k: toml_value(v) for k, v in t.items()} for n, t in by_name.items() if t}
        if not nested:
            continue
        if kind in ("tpm", "crs"):
            out[f"{kind}_params"] = nested
        else:
            out.update(nested)
    return out


def set_legacy(tables: SettingsTables, legacy_key: str, value: Any, key: str) -> None:
    """Set the value given with the flat key ``legacy_key`` (written as ``key``) where it now lives."""
    kind, name, setting = LEGACY[legacy_key]
    unset = legacy_key in LEGACY_UNSET and value == LEGACY_UNSET[legacy_key] and not isinstance(value, bool)
    tables.set(kind, name, setting, value, key, unset=unset)
