# Sourced by scripts/setup.sh, scripts/start.sh and scripts/gpu_check.sh (not run on its own):
# which CUDA PJRT plugin the node uses on an NVIDIA GPU, where `setup.sh --gpu` installs it and
# the NVIDIA libraries it loads, and whether this machine has an NVIDIA driver.

# The JAX release whose CUDA 13 plugin is installed. The plugin wheel is jax-cuda13-pjrt of this
# version; the NVIDIA wheels below are what jax-cuda13-plugin of the same version names in its
# `with-cuda` extra (what `pip install jax[cuda13]` installs), read from that wheel's METADATA.
# Change them together.
xla_node_jax_cuda_version=0.11.2
xla_node_nvidia_requirements=(
    "nvidia-cublas>=13.0.0.19"
    "nvidia-cuda-cupti>=13.0.48"
    "nvidia-cuda-nvcc>=13.0.48"
    "nvidia-cuda-runtime>=13.0.48"
    "nvidia-cudnn-cu13>=9.12.0.46,<10.0"
    "nvidia-cufft>=12.0.0.15"
    "nvidia-cusolver>=12.0.3.29"
    "nvidia-cusparse>=12.6.2.49"
    "nvidia-nccl-cu13>=2.27.7"
    "nvidia-nvjitlink>=13.0.39"
    "nvidia-cuda-nvrtc>=13.0.48"
    "nvidia-nvshmem-cu13>=3.3.20"
    "nvidia-nvvm"
)

# One `pip install --target` directory holds the plugin and the NVIDIA wheels, so that the
# plugin's RPATH ($ORIGIN/../../nvidia/cu13/lib, .../nvidia/cudnn/lib, .../nvidia/nccl/lib) finds
# the libraries without LD_LIBRARY_PATH.
xla_node_cuda_dir="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node/cuda"
xla_node_cuda_plugin="$xla_node_cuda_dir/jax_plugins/xla_cuda13/xla_cuda_plugin.so"
# ptxas (bin/) and libdevice (nvvm/libdevice/) from the nvidia-cuda-nvcc and nvidia-nvvm wheels.
xla_node_cuda_data_dir="$xla_node_cuda_dir/nvidia/cu13"
# Written last by setup.sh: the version installed there, so that a finished install is skipped
# and a half-finished or older one is not.
xla_node_cuda_stamp="$xla_node_cuda_dir/.xla_node_jax_cuda_version"

# Succeeds when the NVIDIA driver is installed: its user-space library libcuda.so.1 is in the
# dynamic linker's cache, or its kernel module reports a version.
xla_node_nvidia_driver_present() {
    [ -r /proc/driver/nvidia/version ] && return 0
    local ldconfig cache
    ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
    [ -x "$ldconfig" ] || return 1
    # Read whole before grep: grep -q closing the pipe early would fail the pipeline under
    # pipefail.
    cache=$("$ldconfig" -p 2>/dev/null) || return 1
    grep -q 'libcuda\.so\.1 ' <<<"$cache"
}

# The one message for a machine without the driver.
xla_node_no_driver_message="no NVIDIA driver found (no libcuda.so.1 in the dynamic linker's cache, no /proc/driver/nvidia/version): --gpu needs an NVIDIA GPU with its driver installed (CUDA 13: driver 580 or newer); nothing was installed"
