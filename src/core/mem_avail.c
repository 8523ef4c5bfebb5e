/* Memory this process can still take (mem_avail.h). */
#include "core/mem_avail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first number in a small file, or `none` for a file holding "max" (a
 * v2 limit that is not set); 0 when the file cannot be read or parsed. */
static int read_u64(const char *path, uint64_t none, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = {0};
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (!strncmp(buf, "max", 3)) {
        *out = none;
        return 1;
    }
    char *end;
    const unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf) return 0;
    *out = (uint64_t)v;
    return 1;
}

/* room = limit - usage at dir, lowered into *room where smaller; a v1 limit
 * near 2^63 is the kernel's "no limit" */
static void room_at(const char *dir, const char *limit_file, const char *usage_file, uint64_t *room) {
    char p[4200];
    uint64_t lim, use;
    snprintf(p, sizeof p, "%s/%s", dir, limit_file);
    if (!read_u64(p, UINT64_MAX, &lim) || lim >= ((uint64_t)1 << 62)) return;
    snprintf(p, sizeof p, "%s/%s", dir, usage_file);
    if (!read_u64(p, 0, &use)) use = 0;
    const uint64_t r = lim > use ? lim - use : 0;
    if (r < *room) *room = r;
}

/* every level of cgroup path `path` under `base`, from the leaf to the root */
static void room_up(const char *base, const char *path, const char *limit_file, const char *usage_file,
                    uint64_t *room) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s", base, path);
    for (;;) {
        room_at(dir, limit_file, usage_file, room);
        char *slash = strrchr(dir + strlen(base), '/');
        if (!slash) break;
        *slash = 0;
        if (strlen(dir) == strlen(base)) {
            room_at(dir, limit_file, usage_file, room);
            break;
        }
    }
}

uint64_t di_mem_available_at(const char *proc_root, const char *cgroup_root) {
    char p[4200], line[4096];
    snprintf(p, sizeof p, "%s/meminfo", proc_root);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    unsigned long long kb = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    if (!found) return 0;
    uint64_t avail = (uint64_t)kb * 1024, room = UINT64_MAX;
    snprintf(p, sizeof p, "%s/self/cgroup", proc_root);
    if ((f = fopen(p, "r"))) {
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            /* "0::/path" (v2, unified) or "N:controllers:/path" (v1) */
            char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
            if (!a || !b || b[1] != '/') continue;
            *a = 0; /* line: the hierarchy's number */
            *b = 0;
            const char *ctrl = a + 1, *path = b + 1;
            char base[4200];
            if (!strcmp(line, "0") && !*ctrl) {
                snprintf(base, sizeof base, "%s", cgroup_root);
                room_up(base, path, "memory.max", "memory.current", &room);
                snprintf(base, sizeof base, "%s/unified", cgroup_root); /* hybrid hierarchies */
                room_up(base, path, "memory.max", "memory.current", &room);
            } else {
                for (const char *c = ctrl; *c;) {
                    const size_t n = strcspn(c, ",");
                    if (n == 6 && !strncmp(c, "memory", 6)) {
                        snprintf(base, sizeof base, "%s/memory", cgroup_root);
                        room_up(base, path, "memory.limit_in_bytes", "memory.usage_in_bytes", &room);
                    }
                    c += n + (c[n] == ',');
                }
            }
        }
        fclose(f);
    }
    return avail < room ? avail : room;
}

uint64_t di_mem_available(void) { return di_mem_available_at("/proc", "/sys/fs/cgroup"); }
