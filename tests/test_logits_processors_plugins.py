"""Plugins: a fake installed distribution registers processors under `vllm.logits_processors`; FQCN loading; errors."""
import textwrap

import pytest
import torch

from kvref.sample.logits_processors import (
    LOGITSPROCS_GROUP, LogitsProcessorConfig, MinTokensLogitsProcessor, build_logitsprocs, load_logitsprocs_by_fqcns,
    load_logitsprocs_plugins, validate_logits_processors_parameters,
)
from kvref.sample.sampling_params import SamplingParams

CPU = torch.device("cpu")
CFG = LogitsProcessorConfig(max_num_seqs=4)

PLUGIN_SOURCE = textwrap.dedent('''
    import torch
    from kvref.sample.logits_processors import LogitsProcessor

    class Base(LogitsProcessor):
        def __init__(self, config, device, is_pin_memory):
            self.max_num_seqs = config.max_num_seqs
        def apply(self, logits):
            return logits
        def is_argmax_invariant(self):
            return True
        def update_state(self, batch_update):
            pass

    class Plugin(Base):
        @classmethod
        def validate_params(cls, sampling_params):
            if sampling_params.min_p > 0.5:
                raise ValueError("Plugin: min_p above 0.5 is not supported")

    class Outer:
        class Inner(Base):
            def is_argmax_invariant(self):
                return False

    class NotAProcessor:
        pass

    NOT_A_TYPE = 3
''')


def install(tmp_path, monkeypatch, entry_points: dict[str, str], extra_modules: dict[str, str] = None):
    """Write a package and a dist-info with the given entry points, and put them on sys.path."""
    (tmp_path / "kvref_lp_plugin_pkg.py").write_text(PLUGIN_SOURCE)
    for name, src in (extra_modules or {}).items():
        (tmp_path / f"{name}.py").write_text(src)
    dist = tmp_path / "kvref_lp_plugin_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvref-lp-plugin-pkg\nVersion: 0.1\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[{LOGITSPROCS_GROUP}]\n{lines}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def names(procs):
    return [type(p).__name__ for p in procs.all]


def test_no_plugins_installed():
    assert load_logitsprocs_plugins() == []


def test_entry_point_plugin_is_built_after_builtins(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, {"plug": "kvref_lp_plugin_pkg:Plugin"})
    [cls] = load_logitsprocs_plugins()
    assert cls.__name__ == "Plugin"
    procs = build_logitsprocs(CFG, CPU, False, False, ["kvref_lp_plugin_pkg:Outer.Inner"])
    assert [type(p).__name__ for p in procs.argmax_invariant] == ["MinPLogitsProcessor", "Plugin"]
    assert [type(p).__name__ for p in procs.non_argmax_invariant] == [
        "MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "Inner"]
    plugin = next(p for p in procs.all if type(p).__name__ == "Plugin")
    assert plugin.max_num_seqs == 4  # built with kvref's config object


def test_modes_ignore_or_reject_custom(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, {"plug": "kvref_lp_plugin_pkg:Plugin"})
    assert names(build_logitsprocs(CFG, CPU, False, True)) == []  # pooling: none, plugins not even loaded
    spec = LogitsProcessorConfig(max_num_seqs=4, num_speculative_tokens=3)
    assert names(build_logitsprocs(spec, CPU, False, False)) == [MinTokensLogitsProcessor.__name__]
    with pytest.raises(ValueError, match="Pooling models do not support custom logits processors"):
        build_logitsprocs(CFG, CPU, False, True, ["kvref_lp_plugin_pkg:Plugin"])
    with pytest.raises(ValueError, match="not supported when speculative decoding is enabled"):
        build_logitsprocs(spec, CPU, False, False, ["kvref_lp_plugin_pkg:Plugin"])


def test_validate_params_is_asked(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, {"plug": "kvref_lp_plugin_pkg:Plugin"})
    validate_logits_processors_parameters(None, SamplingParams(min_p=0.2))
    with pytest.raises(ValueError, match="Plugin: min_p above 0.5"):
        validate_logits_processors_parameters(None, SamplingParams(min_p=0.7))


def test_broken_entry_point_names_the_plugin(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, {"broken": "kvref_lp_broken_mod:Thing"},
            {"kvref_lp_broken_mod": "raise ImportError('missing dependency xyz')\n"})
    with pytest.raises(RuntimeError, match="failed to load logits processor plugin 'broken'") as e:
        load_logitsprocs_plugins()
    assert "missing dependency xyz" in str(e.value.__cause__)


@pytest.mark.parametrize("target, msg", [
    ("kvref_lp_plugin_pkg:NotAProcessor", "NotAProcessor must be a subclass of LogitsProcessor"),
    ("kvref_lp_plugin_pkg:NOT_A_TYPE", "must be a type"),
])
def test_entry_point_to_wrong_object(tmp_path, monkeypatch, target, msg):
    install(tmp_path, monkeypatch, {"wrong": target})
    with pytest.raises(ValueError, match=f"plugin 'wrong'.*{msg}"):
        load_logitsprocs_plugins()


@pytest.mark.parametrize("spec, exc, msg", [
    ("kvref_lp_plugin_pkg", ValueError, "expected a class or 'module.path:Qualname'"),
    ("a:b:c", ValueError, "expected a class or 'module.path:Qualname'"),
    (":Plugin", ValueError, "expected a class"),
    (42, ValueError, "expected a class"),
    ("kvref_lp_no_such_module:X", RuntimeError, "failed to load logits processor plugin #0"),
    ("kvref_lp_plugin_pkg:Outer.Missing", ValueError, "no attribute 'Missing'"),
    ("kvref_lp_plugin_pkg:NotAProcessor", ValueError, "NotAProcessor must be a subclass of LogitsProcessor"),
    ("kvref_lp_plugin_pkg:NOT_A_TYPE", ValueError, "must be a type"),
    (SamplingParams, ValueError, "SamplingParams must be a subclass of LogitsProcessor"),
])
def test_fqcn_errors(tmp_path, monkeypatch, spec, exc, msg):
    install(tmp_path, monkeypatch, {})
    with pytest.raises(exc, match=msg):
        load_logitsprocs_by_fqcns([spec])


def test_fqcn_nested_and_class_objects(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, {})
    [inner, plugin] = load_logitsprocs_by_fqcns(["kvref_lp_plugin_pkg:Outer.Inner", "kvref_lp_plugin_pkg:Plugin"])
    assert inner.__qualname__ == "Outer.Inner"
    assert load_logitsprocs_by_fqcns([plugin]) == [plugin]
    with pytest.raises(RuntimeError, match=r"plugin #1 'kvref_lp_nope:X'"):
        load_logitsprocs_by_fqcns([plugin, "kvref_lp_nope:X"])
