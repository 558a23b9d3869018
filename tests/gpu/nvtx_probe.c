/* A stand-in for Nsight Systems: an NVTX injection library. Nsight loads its
   own the same way (NVTX_INJECTION64_PATH), so ranges that reach this probe
   reach Nsight. At exit it writes, to $HIR_NVTX_PROBE_OUT, how many ranges
   were pushed and popped and the count per name:
       NVTX_INJECTION64_PATH=build/nvtx_probe.so HIR_NVTX_PROBE_OUT=n.txt build/main */
#define NVTX_NO_IMPL /* the types only: this library is the tool, not a caller */
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NAMES = 64 };
static struct { char name[48]; long count; } names[NAMES];
static long pushes, pops;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int probe_push(const char *name) {
  int i;
  pthread_mutex_lock(&mu);
  pushes++;
  for (i = 0; i < NAMES && names[i].count && strcmp(names[i].name, name); i++) {}
  if (i < NAMES) {
    snprintf(names[i].name, sizeof names[i].name, "%s", name);
    names[i].count++;
  }
  pthread_mutex_unlock(&mu);
  return 0;
}

static int probe_pop(void) {
  pthread_mutex_lock(&mu);
  pops++;
  pthread_mutex_unlock(&mu);
  return 0;
}

static void probe_report(void) {
  const char *path = getenv("HIR_NVTX_PROBE_OUT");
  FILE *f = path ? fopen(path, "w") : NULL;
  int i;
  if (!f) return;
  fprintf(f, "pushes %ld\npops %ld\n", pushes, pops);
  for (i = 0; i < NAMES && names[i].count; i++) fprintf(f, "range %s %ld\n", names[i].name, names[i].count);
  fclose(f);
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get_table(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = NULL;
  unsigned int size = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || size <= NVTX_CBID_CORE_RangePop)
    return 0;
  *table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)probe_push;
  *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)probe_pop;
  atexit(probe_report);
  return 1;
}
