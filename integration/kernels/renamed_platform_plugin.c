/* A PJRT plugin for tests: the PJRT CPU plugin under another platform name.
 *
 * GetPjrtApi loads the plugin named by $XLA_NODE_WRAPPED_PJRT_PLUGIN and returns a copy of its
 * API table in which PJRT_Client_PlatformName answers "xn_renamed". Everything else is the real
 * CPU plugin's. A node started on it runs on a platform it has no host-callback handler for, as
 * on an accelerator it does not know, and takes the paths it takes off the CPU (results read
 * back through PJRT, not from host memory), with no accelerator on the machine.
 *
 * Built by scripts/kernels.sh against the CPU plugin's own pjrt_c_api.h.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pjrt_c_api.h"

static const char kPlatform[] = "xn_renamed";

static PJRT_Api renamed;
static PJRT_Client_PlatformName* real_platform_name;

static PJRT_Error* renamed_platform_name(PJRT_Client_PlatformName_Args* args) {
  PJRT_Error* error = real_platform_name(args);
  if (error == NULL) {
    args->platform_name = kPlatform;
    args->platform_name_size = sizeof kPlatform - 1;
  }
  return error;
}

const PJRT_Api* GetPjrtApi(void) {
  if (renamed.struct_size != 0) return &renamed;
  const char* path = getenv("XLA_NODE_WRAPPED_PJRT_PLUGIN");
  if (path == NULL || *path == '\0') {
    fprintf(stderr, "renamed_platform_plugin: set XLA_NODE_WRAPPED_PJRT_PLUGIN to the CPU plugin\n");
    return NULL;
  }
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "renamed_platform_plugin: %s\n", dlerror());
    return NULL;
  }
  const PJRT_Api* (*get)(void) = (const PJRT_Api* (*)(void))dlsym(lib, "GetPjrtApi");
  const PJRT_Api* real = get == NULL ? NULL : get();
  if (real == NULL || real->struct_size < sizeof renamed) {
    fprintf(stderr, "renamed_platform_plugin: %s is not a PJRT plugin of this header's size\n", path);
    return NULL;
  }
  memcpy(&renamed, real, sizeof renamed);
  real_platform_name = real->PJRT_Client_PlatformName;
  renamed.PJRT_Client_PlatformName = renamed_platform_name;
  return &renamed;
}
