"""quant's names of a GGUF's tensors: each tensor shift of analysis.quant named by the
file's tensor (llama.cpp's names, storage.gguf_file.gguf_names) and its type."""

from __future__ import annotations

from ..analysis.quant import QuantReport
from ..storage.gguf_file import gguf_names


def file_tensors(config, tensor_types: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Each unit's label (analysis.quant.tensor_units) -> (the GGUF tensor it is, its type);
    a fused attn_qkv is q's, k's and v's tensor alike."""

    out = {}
    for canonical, files in gguf_names(config).items():
        if canonical.endswith(("W_QKV", "b_QKV")):
            parts = files if len(files) == 3 else files * 3
            for p, f in zip("qkv", parts, strict=True):
                out[f"{canonical}[{p}]"] = (f, tensor_types.get(f, "?"))
        else:
            out[canonical] = (files[0], tensor_types.get(files[0], "?"))
    return out


def name_files(report: QuantReport, quant_model) -> None:
    """Each tensor shift's GGUF tensor and type, when the quantized model is a GGUF."""
    about = getattr(quant_model, "about", None)
    if not about or "tensors" not in about:
        return
    names = file_tensors(quant_model.config, about["tensors"])
    for s in report.tensors:
        s.file, s.kind = names.get(s.label, (None, None))
