"""dprobe: forecast GPU memory and utilisation of deep-learning workloads."""

import warnings

__version__ = "0.1.0"

# torch_geometric scripts a helper with torch.jit at import time, which newer torch flags as deprecated;
# it says nothing about dprobe and would otherwise greet every command
warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
