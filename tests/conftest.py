import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # (not keywords: a folder named gpu)
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True, scope="module")
def _no_leaked_process_group(request):
    """Tests share one pytest process: a test module that leaves torch.distributed
    initialised changes what every later module sees (the dry run refuses a real group,
    say). After each module (its own module-scoped worlds torn down first) the group is
    destroyed and the module that left it fails, named."""
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    backend = dist.get_backend()
    dist.destroy_process_group()
    pytest.fail(f"{request.node.nodeid} left a torch.distributed process group "
                f"({backend}) initialised; destroy it before returning", pytrace=False)
