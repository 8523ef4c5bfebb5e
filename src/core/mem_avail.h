/* How much more memory this process can take without the kernel reclaiming
 * from it or killing it: the smaller of the system's MemAvailable and the
 * room left under the memory limits of the process's cgroups (v2 memory.max,
 * v1 memory.limit_in_bytes, at every level up to the root), so that a choice
 * made on it holds inside a container with a memory limit as well as on a
 * whole machine. Linux only; elsewhere, or where nothing can be read, 0
 * ("unknown": callers then take no extra memory). */
#ifndef DI_CORE_MEM_AVAIL_H
#define DI_CORE_MEM_AVAIL_H

#include <stdint.h>

uint64_t di_mem_available(void);

/* The same, reading `meminfo` and `self/cgroup` under proc_root and the
 * cgroup files under cgroup_root (tests: "/proc" and "/sys/fs/cgroup"
 * otherwise). */
uint64_t di_mem_available_at(const char *proc_root, const char *cgroup_root);

#endif
