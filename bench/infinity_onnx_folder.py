"""The model folder infinity's optimum engine serves, made under infinity's optimum Python (bench/serve.py
`--infinity_optimum_python`): the model's files, and beside them `model.onnx`, the model exported by optimum and
optimized as infinity's engine would optimize it (`ORTOptimizer`, level 99, for the CPU).

infinity-emb 0.0.78 with optimum 2.x cannot do either itself: its engine finds no ONNX file in a local folder of
safetensors, and its own optimization passes an argument `OptimizationConfig` no longer takes (it then serves the
file unoptimized). Its file lookup also hands optimum a path that optimum 2.x resolves against the folder a second
time, so the file lies at the folder's top and the server runs in it (`--model-id=.`).

    python bench/infinity_onnx_folder.py MODEL_DIR OUT_DIR
"""

import shutil
import sys
import tempfile
from pathlib import Path

from optimum.exporters.onnx import main_export
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer
from optimum.onnxruntime.configuration import OptimizationConfig


def main() -> None:
    model, out = Path(sys.argv[1]), Path(sys.argv[2])
    shutil.copytree(model, out)
    with tempfile.TemporaryDirectory() as tmp:
        main_export(str(model), output=tmp, task="feature-extraction")
        optimizer = ORTOptimizer.from_pretrained(ORTModelForFeatureExtraction.from_pretrained(tmp))
        config = OptimizationConfig(optimization_level=99, optimize_for_gpu=False, fp16=False)
        optimizer.optimize(config, save_dir=Path(tmp, "optimized"))
        shutil.copy(Path(tmp, "optimized", "model_optimized.onnx"), out / "model.onnx")


if __name__ == "__main__":
    main()
