/* Continuous-batching policy with memory admission and preemption (see
 * scheduler.h). */
#include "engine/scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void di_scheduler_init(di_scheduler *s, di_memory *mem, int max_batch, int64_t budget, int64_t max_chunk,
                       int64_t max_len) {
    memset(s, 0, sizeof *s);
    s->mem = mem;
    s->max_batch = max_batch;
    s->budget = budget;
    s->max_chunk = max_chunk > 0 && max_chunk < budget ? max_chunk : budget;
    s->max_len = max_len;
    s->margin = 128;
}

void di_scheduler_free(di_scheduler *s) {
    for (size_t i = 0; i < s->n_queue; i++) {
        di_seq *q = s->queue[i];
        di_memory_release(s->mem, q->state, q->state_bytes);
        q->state = NULL;
    }
    free(s->queue);
    memset(s, 0, sizeof *s);
}

int di_scheduler_add(di_scheduler *s, di_seq *seq) {
    if (s->n_queue == s->cap_queue) {
        size_t cap = s->cap_queue * 2 + 16;
        di_seq **q = realloc(s->queue, cap * sizeof *q);
        if (!q) return -1;
        s->queue = q;
        s->cap_queue = cap;
    }
    seq->phase = DI_SEQ_WAITING;
    seq->order = s->next_order++;
    s->queue[s->n_queue++] = seq;
    return 0;
}

static void drop_state(di_scheduler *s, di_seq *q) {
    di_memory_release(s->mem, q->state, q->state_bytes);
    q->state = NULL;
    q->state_bytes = 0;
    q->state_cap = 0;
    q->n_computed = 0;
}

void di_scheduler_retire(di_scheduler *s, di_seq *seq) {
    drop_state(s, seq);
    for (size_t i = 0; i < s->n_queue; i++)
        if (s->queue[i] == seq) {
            memmove(s->queue + i, s->queue + i + 1, (s->n_queue - i - 1) * sizeof *s->queue);
            s->n_queue--;
            break;
        }
}

/* Capacity to allocate for a sequence about to hold n_tokens (+1 to decode
 * the next): its tokens plus a margin of min(remaining outputs, margin),
 * rounded to 16, at most max_len. */
static int64_t want_cap(const di_scheduler *s, const di_seq *q, int64_t at_least) {
    int64_t left = q->req->max_tokens - di_seq_n_output(q);
    if (left < 0) left = 0;
    int64_t c = q->n_tokens + (left < s->margin ? left : s->margin) + 1;
    if (c < at_least) c = at_least;
    if (c < q->state_cap * 2 && q->state_cap) c = q->state_cap * 2; /* growth doubles */
    c = (c + 15) / 16 * 16;
    if (c > s->max_len) c = s->max_len;
    if (c < at_least) c = at_least;
    return c;
}

static void fail_seq(di_seq *q, const char *msg) {
    q->phase = DI_SEQ_DONE;
    q->finish = DI_FINISH_ERROR;
    free(q->error);
    q->error = strdup(msg); /* NULL when out of memory: see di_seq_error() */
}

/* Gives q a state of capacity >= need (fresh: recompute from position 0),
 * preempting newer sequences when the budget is short. 1 on success, 0 when
 * q must wait (an older sequence holds the memory), -1 when it can never fit. */
static int ensure_state(di_scheduler *s, di_seq *q, int64_t need, int may_preempt) {
    if (q->state && q->state_cap >= need) return 1;
    int64_t cap = want_cap(s, q, need);
    for (;;) {
        uint64_t have = q->state ? q->state_bytes : 0;
        if (s->mem->used - have + di_memory_bytes(s->mem, cap) <= s->mem->limit) break;
        if (cap > need) { /* first try the bare minimum */
            cap = need;
            continue;
        }
        if (!may_preempt) {
            for (size_t i = 0; i < s->n_queue; i++)
                if (s->queue[i] != q && s->queue[i]->state) return 0; /* wait for memory */
            return -1;
        }
        /* only sequences admitted after q give way to it */
        di_seq *victim = NULL;
        for (size_t i = 0; i < s->n_queue; i++) {
            di_seq *v = s->queue[i];
            if (v != q && v->state && v->order > q->order && (!victim || v->order > victim->order)) victim = v;
        }
        if (!victim) {
            int others = 0;
            for (size_t i = 0; i < s->n_queue; i++)
                if (s->queue[i] != q && s->queue[i]->state) others = 1;
            if (others) {
                /* older sequences hold the memory: step aside (and free ours) */
                drop_state(s, q);
                q->phase = DI_SEQ_WAITING;
                s->preemptions++;
                return 0;
            }
            return -1;
        }
        drop_state(s, victim);
        victim->phase = DI_SEQ_WAITING;
        s->preemptions++;
    }
    drop_state(s, q);
    di_err err = {0};
    if (di_memory_alloc(s->mem, cap, &q->state, &q->state_bytes, &err)) return -1;
    q->state_cap = cap;
    q->n_computed = 0;
    q->phase = DI_SEQ_RUNNING;
    return 1;
}

static int by_order(const void *a, const void *b) {
    const di_seq *x = *(di_seq *const *)a, *y = *(di_seq *const *)b;
    return (x->order > y->order) - (x->order < y->order);
}

size_t di_scheduler_plan(di_scheduler *s, di_sched_item *items, di_seq **failed, size_t *n_failed) {
    size_t n = 0;
    *n_failed = 0;
    int64_t budget = s->budget;
    /* admission order = queue order; preempted sequences keep theirs and so
     * come back first */
    if (s->n_queue > 1) qsort(s->queue, s->n_queue, sizeof *s->queue, by_order);
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: running sequences (decode first, as they need one token);
         * pass 1: waiting ones, admitted while memory and budget last */
        for (int decode_first = 1; decode_first >= 0; decode_first--) {
            for (size_t i = 0; i < s->n_queue && n < (size_t)s->max_batch && budget > 0; i++) {
                di_seq *q = s->queue[i];
                if (q->phase == DI_SEQ_DONE) continue;
                if ((pass == 0) != (q->phase == DI_SEQ_RUNNING)) continue;
                int64_t todo = q->n_tokens - q->n_computed;
                if (pass == 0 && (todo == 1) != decode_first) continue;
                if (pass == 1 && !decode_first) continue;
                int already = 0;
                for (size_t j = 0; j < n; j++) already |= items[j].seq == q;
                if (already || todo <= 0) continue;
                int64_t need = q->n_tokens + 1 > s->max_len ? s->max_len : q->n_tokens + 1;
                int r = ensure_state(s, q, need, pass == 0);
                if (r < 0) {
                    char msg[256];
                    snprintf(msg, sizeof msg,
                             "the state of a %lld-token sequence (%llu bytes) does not fit the memory budget "
                             "(%llu bytes)",
                             (long long)need, (unsigned long long)di_memory_bytes(s->mem, need),
                             (unsigned long long)s->mem->limit);
                    fail_seq(q, msg);
                    if (*n_failed < (size_t)s->max_batch) failed[*n_failed] = q;
                    (*n_failed)++;
                    continue;
                }
                if (r == 0) {
                    if (pass == 1) break; /* FCFS: later arrivals wait behind it */
                    continue;
                }
                /* a fresh state (new, grown or after preemption) recomputes */
                todo = q->n_tokens - q->n_computed;
                int64_t c = todo;
                if (c > s->max_chunk) c = s->max_chunk;
                if (c > budget) c = budget;
                items[n].seq = q;
                items[n].start = q->n_computed;
                items[n].n = c;
                items[n].sample = q->n_computed + c == q->n_tokens;
                budget -= c;
                n++;
            }
        }
    }
    /* a preemption in pass 1 cannot hit a planned item (victims are newer
     * than q and only running ones are planned before), but a grow in pass
     * 0 may have evicted an earlier planned sequence: drop those items */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (items[i].seq->state && items[i].seq->n_computed == items[i].start) items[k++] = items[i];
    return k;
}
