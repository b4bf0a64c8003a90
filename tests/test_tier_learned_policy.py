"""Specification of how a policy chooses its tier classifier (router_policies/tier_classifiers.py,
router_policies/tier_settings.py): the learned model is the default and the cue model stays
selectable, a tier without a model file uses the shipped model and one with a file uses it, a
missing or unloadable file and bad classifier settings are policy errors, and calibration
survives a reload with the same model (each file loaded once, kept while unchanged) but not a
switch; and of /admin/route in a running gateway, which shows the learned model's score,
threshold and strongest contributions."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from pydantic import ValidationError

from bench.launcher import start_gateway
from bench.tier_eval.train import TrainConfig, train
from gateway.fleet.pools import Fleet
from gateway.policy.check import load_checked_policy
from replica.processes import ManagedProcess
from router_policies import tier_classifiers
from router_policies.schema import InvalidPolicy, effective_policy_yaml, read_policy
from router_policies.tier_classifier_learned import EXPLAIN_TOP, LearnedTierModel
from router_policies.tier_classifiers import CACHED_MODELS, CueClassifier, load_learned
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierClassifierName, TierSettings
from tests.conftest import FAST_PROBES
from tests.tier_learning import OBVIOUSLY_EASY, OBVIOUSLY_HARD, SHIPPED, TINY, tiny_examples
from tests.tiers import chat, small_and_large, two_pools

# --- choosing the classifier in the policy ----------------------------------------------------


def settings(**extra: Any) -> TierSettings:
    return TierSettings.model_validate({"small": "s", "large": "l", **extra})


def test_the_learned_model_is_the_default_and_the_cue_model_stays_selectable() -> None:
    # The learned model ranks held-out public prompts and the project's own set better
    # (docs/tier-eval.md); the cue model ranks real user prompts worse than chance.
    assert settings().classifier is TierClassifierName.LEARNED
    assert TierRouter("auto", settings()).classifier is SHIPPED
    assert isinstance(TierRouter("auto", settings(classifier="cue")).classifier, CueClassifier)


def test_learned_without_a_model_uses_the_shipped_one() -> None:
    router = TierRouter("auto", settings(classifier="learned"))
    assert router.classifier is SHIPPED
    verdict = router.classify(chat("Prove that there are infinitely many primes."))
    assert verdict.score.classifier == "learned"


def test_learned_with_a_model_file_uses_it(tmp_path: Path) -> None:
    path = tmp_path / "mine.json.gz"
    train(tiny_examples(), TrainConfig(min_df=1)).save(path)
    router = TierRouter("auto", settings(classifier="learned", model=str(path)))
    assert isinstance(router.classifier, LearnedTierModel)
    assert router.classifier.meta["examples"] == len(TINY)


def test_a_relative_model_path_is_read_from_the_policy_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where a Kubernetes ConfigMap mounts both, whatever the gateway's working directory.
    train(tiny_examples(), TrainConfig(min_df=1)).save(tmp_path / "mine.json.gz")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "pools:\n"
        "  s: {model: s, replicas: ['http://127.0.0.1:1']}\n"
        "  l: {model: l, replicas: ['http://127.0.0.1:2']}\n"
        "tiers:\n"
        "  auto: {small: s, large: l, classifier: learned, model: mine.json.gz}\n"
    )
    monkeypatch.chdir(tmp_path.parent)
    tier = load_checked_policy(policy).tiers["auto"]
    assert tier.model == "mine.json.gz"  # as written: the effective policy moves with the file
    assert tier.model_file == str(tmp_path / "mine.json.gz")
    assert isinstance(TierRouter("auto", tier).classifier, LearnedTierModel)


@pytest.mark.parametrize("classifier", ["learned", "cue"])
def test_the_effective_policy_check_policy_prints_reads_back_as_the_same(classifier: str) -> None:
    text = (Path(__file__).parent.parent / "router_policies/examples/tiers.yaml").read_text()
    policy, _ = read_policy(text.replace("classifier: learned", f"classifier: {classifier}"))
    again, _ = read_policy(effective_policy_yaml(policy))
    assert again == policy


def test_a_missing_model_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no file"):
        settings(classifier="learned", model=str(tmp_path / "nope.json.gz"))


def test_a_model_file_that_does_not_load_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not a model")
    with pytest.raises(InvalidPolicy, match=r"tiers\.auto\.model: .*not a tier model file"):
        TierRouter("auto", settings(classifier="learned", model=str(bad)))


@pytest.mark.parametrize(
    "bad",
    [
        {"classifier": "neural"},
        {"model": "m.json.gz"},
        {"classifier": "cue", "model": "m.json.gz"},
    ],
)
def test_bad_classifier_settings_are_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        settings(**bad)


def test_calibration_survives_a_reload_with_the_same_model_but_not_a_switch() -> None:
    calibrated = {"calibration": {"target_large_share": 0.3, "min_samples": 10}}
    first = TierRouter("auto", settings(classifier="learned", **calibrated))
    for text in OBVIOUSLY_HARD + OBVIOUSLY_EASY:
        first.observe(first.classify(chat(text)), sent_large=False)  # the calibration only
    same = TierRouter("auto", settings(classifier="learned", **calibrated), previous=first)
    assert same.threshold == first.threshold
    switched = TierRouter("auto", settings(classifier="cue", **calibrated), previous=first)
    assert switched._calibrator is not first._calibrator


def test_two_tiers_on_two_model_files_keep_their_calibration_across_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine.json.gz"
    mine.write_bytes(SHIPPED.to_bytes())
    calibrated = {"calibration": {"target_large_share": 0.5, "window": 20, "min_samples": 10}}
    tiers = {
        "auto": {"small": "small", "large": "large", **calibrated},
        "mine": {"small": "small", "large": "large", "model": str(mine), **calibrated},
    }
    pools = {
        "small": {"model": "s", "replicas": ["http://10.0.0.1:8000"]},
        "large": {"model": "l", "replicas": ["http://10.0.0.2:8000"]},
    }
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(orjson.dumps({"pools": pools, "tiers": tiers}).decode())
    reads: list[str | None] = []
    load = LearnedTierModel.load

    def counted(path: str | None = None) -> LearnedTierModel:
        reads.append(path)
        return load(path)

    monkeypatch.setattr(LearnedTierModel, "load", counted)

    first = Fleet(load_checked_policy(policy_file))  # check-policy's load, then the fleet's
    for router in first.tiers.values():
        for text in OBVIOUSLY_HARD + OBVIOUSLY_EASY:
            router.observe(router.classify(chat(text)), sent_large=False)  # the calibration only
    reloaded = Fleet(load_checked_policy(policy_file), previous=first)

    # Read once, for every check and fleet after it (the shipped model, path None, may be read
    # too: other tests' files may have pushed it out of the cache).
    assert reads.count(str(mine)) == 1
    for name, router in reloaded.tiers.items():
        assert router.classifier is first.tiers[name].classifier
        assert router.threshold == first.tiers[name].threshold != 0.5


def test_a_changed_model_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "mine.json.gz"
    path.write_bytes(SHIPPED.to_bytes())
    before = load_learned(str(path))
    assert load_learned(str(path)) is before
    train(tiny_examples(), TrainConfig(min_df=1)).save(path)
    assert load_learned(str(path)).meta["examples"] == len(TINY)


def test_a_few_model_files_stay_loaded_the_least_recently_used_forgotten_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tier_classifiers, "_loaded", OrderedDict())  # the others' stay cached
    model = train(tiny_examples(), TrainConfig(min_df=1)).to_bytes()
    paths = [tmp_path / f"m{i}.json.gz" for i in range(CACHED_MODELS + 1)]
    for path in paths:
        path.write_bytes(model)
    first = load_learned(str(paths[0]))
    kept = [load_learned(str(path)) for path in paths[1:CACHED_MODELS]]
    assert load_learned(str(paths[0])) is first  # used again: now the most recent
    load_learned(str(paths[-1]))  # one past the bound: the least recently used goes
    assert load_learned(str(paths[0])) is first
    assert load_learned(str(paths[1])) is not kept[0]


# --- /admin/route explains the learned model's decision ---------------------------------------

TOKEN = "tier-test-token"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def learned_gateway() -> AsyncIterator[ManagedProcess]:
    async with small_and_large() as pools:
        policy = two_pools(pools, classifier="learned")
        gw = await start_gateway(policy, env={**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": TOKEN})
        yield gw
        await gw.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_admin_route_shows_the_learned_score_threshold_and_contributions(
    learned_gateway: ManagedProcess,
) -> None:
    body = chat("Prove that $\\sqrt{2}$ is irrational.")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{learned_gateway.url}/admin/route",
            data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        tier = (await response.json())["tier"]
    assert tier["classifier"] == "learned"
    assert tier["score"] > tier["threshold"] == 0.5
    assert tier["tier"] == "large"
    assert 0 < len(tier["contributions"]) <= EXPLAIN_TOP
    assert max(tier["contributions"].values()) > 0
    assert tier["contributions"].keys() == tier["features"].keys()
    assert tier["close_call"] is None  # close calls are off: no second prediction made
