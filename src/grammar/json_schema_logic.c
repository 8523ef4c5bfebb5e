/* JSON Schema logic keywords the grammar cannot express directly, rewritten
 * exactly into allOf / anyOf of schemas it can: `not` (by pushing the
 * negation into the keywords), oneOf whose branches may overlap (each branch
 * minus the branches it may share instances with), if/then/else ((if ∧
 * then) ∨ (¬if ∧ else)), and dependencies /
 * dependentRequired / dependentSchemas (absent, or present with what it
 * requires). Spec: ecosystem.md §1.1 (keyword coverage) and §1.4 (refuse
 * what cannot be enforced: a negation we cannot write exactly is an error
 * naming the keyword).
 *
 * The negation of a schema is the union, over its keywords, of the
 * instances each keyword rejects. A keyword only constrains instances of
 * its type (minLength only strings), so each piece carries that type:
 * not {"minLength": 3} is {"type": "string", "maxLength": 2}. Internal
 * keywords close the negation under the compiler's forms: x-di-not-patterns
 * (a string matching none), x-di-not-values (a number equal to none),
 * x-di-non-integer (a number with a non-zero fraction), x-di-contains (some
 * element satisfies it: the negation of `items`), x-di-some-key (a member
 * whose key is not among `names` and whose value satisfies `value`: the
 * negation of additionalProperties). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema.h"
#include "grammar/regex.h"

#define NEG_MAX_DEPTH 16

static const char *at(const js_ctx *c) { return c->path[0] ? c->path : "#"; }

/* {"type": <types of t>} plus key: value (value owned; key may be NULL). */
static cJSON *typed(int t, const char *key, cJSON *value) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "type", di_js_type_array(t));
    if (key) cJSON_AddItemToObject(o, key, value);
    return o;
}

/* The union of pieces (consumed): false when empty. */
static cJSON *union_of(cJSON *pieces) {
    int n = cJSON_GetArraySize(pieces);
    if (n == 0) {
        cJSON_Delete(pieces);
        return cJSON_CreateFalse();
    }
    if (n == 1) {
        cJSON *x = cJSON_DetachItemFromArray(pieces, 0);
        cJSON_Delete(pieces);
        return x;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "anyOf", pieces);
    return o;
}

static int count_of(const cJSON *k, double *out) {
    if (!cJSON_IsNumber(k) || k->valuedouble < 0 || k->valuedouble != floor(k->valuedouble)) return -1;
    *out = k->valuedouble;
    return 0;
}

/* Anchored regex matching exactly the string s (search semantics). */
static cJSON *literal_pattern(const char *s) {
    size_t n = strlen(s), need = di_regex_escape(s, n, NULL, 0) + 3;
    char *rx = malloc(need);
    if (!rx) return NULL;
    rx[0] = '^';
    di_regex_escape(s, n, rx + 1, need - 1);
    strcat(rx, "$");
    cJSON *x = cJSON_CreateString(rx);
    free(rx);
    return x;
}

/* Instances not among the values of `enum` / `const` (vals: array or one
 * value). Strings and numbers are excluded by internal keywords; a value
 * that is an object or array cannot be excluded exactly. */
static int negate_values(js_ctx *c, const cJSON *vals, cJSON *pieces) {
    int single = !cJSON_IsArray(vals);
    int seen = 0, has_true = 0, has_false = 0;
    cJSON *strs = cJSON_CreateArray(), *nums = cJSON_CreateArray();
    for (const cJSON *v = single ? vals : vals->child; v; v = single ? NULL : v->next) {
        int t = di_js_value_type(v);
        if (t == T_OBJ || t == T_ARR) {
            cJSON_Delete(strs);
            cJSON_Delete(nums);
            return FAIL(c, DI_ERR_UNSUPPORTED,
                        "JSON Schema keyword 'not' is not supported in this form: enum/const with an %s value (at %s)",
                        t == T_OBJ ? "object" : "array", at(c));
        }
        if (t == T_STR) cJSON_AddItemToArray(strs, literal_pattern(v->valuestring));
        if (t & (T_INT | T_NUM)) cJSON_AddItemToArray(nums, cJSON_Duplicate(v, 0));
        if (cJSON_IsTrue(v)) has_true = 1;
        if (cJSON_IsFalse(v)) has_false = 1;
        seen |= (t & (T_INT | T_NUM)) ? T_NUM | T_INT : t;
    }
    int free_types = T_ALL & ~seen;
    if (free_types) cJSON_AddItemToArray(pieces, typed(free_types, NULL, NULL));
    if (has_true != has_false) {
        cJSON *o = cJSON_CreateObject(), *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateBool(!has_true));
        cJSON_AddItemToObject(o, "enum", e);
        cJSON_AddItemToArray(pieces, o);
    }
    if (cJSON_GetArraySize(strs)) cJSON_AddItemToArray(pieces, typed(T_STR, "x-di-not-patterns", strs));
    else cJSON_Delete(strs);
    if (cJSON_GetArraySize(nums)) cJSON_AddItemToArray(pieces, typed(T_NUM | T_INT, "x-di-not-values", nums));
    else cJSON_Delete(nums);
    return 0;
}

static cJSON *negate(js_ctx *c, const cJSON *s, int depth);

/* Whether schema s accepts every instance (true, {} or only annotations). */
static int is_trivial(const cJSON *s) {
    if (cJSON_IsTrue(s)) return 1;
    if (!cJSON_IsObject(s)) return 0;
    for (const cJSON *k = s->child; k; k = k->next)
        if (di_js_is_constraint(k->string)) return 0;
    return 1;
}

static int negate_keyword(js_ctx *c, const cJSON *s, const cJSON *k, cJSON *pieces, int depth) {
    const char *n = k->string;
    double x;
    if (!strcmp(n, "type")) {
        int t;
        if (di_js_types_of(c, s, &t)) return -1;
        int comp = T_ALL & ~t;
        if ((t & T_INT) && !(t & T_NUM)) {
            /* numbers that are not integers */
            cJSON *o = typed(T_NUM | T_INT, "x-di-non-integer", cJSON_CreateTrue());
            cJSON_AddItemToArray(pieces, o);
            comp &= ~(T_NUM | T_INT);
        }
        if (comp & T_NUM) comp |= T_INT;
        if (comp) cJSON_AddItemToArray(pieces, typed(comp, NULL, NULL));
        return 0;
    }
    if (!strcmp(n, "enum") || !strcmp(n, "const")) {
        if (!strcmp(n, "enum") && !cJSON_IsArray(k)) return FAIL(c, DI_ERR_FORMAT, "'enum' must be an array");
        return negate_values(c, k, pieces);
    }
    if (!strcmp(n, "required")) {
        for (const cJSON *r = k->child; r; r = r->next) {
            if (!cJSON_IsString(r)) return FAIL(c, DI_ERR_FORMAT, "'required' entries must be strings");
            cJSON *props = cJSON_CreateObject();
            cJSON_AddItemToObject(props, r->valuestring, cJSON_CreateFalse());
            cJSON_AddItemToArray(pieces, typed(T_OBJ, "properties", props));
        }
        return 0;
    }
    if (!strcmp(n, "properties")) {
        for (const cJSON *p = k->child; p; p = p->next) {
            cJSON *np = negate(c, p, depth + 1);
            if (!np) return -1;
            if (cJSON_IsFalse(np)) { cJSON_Delete(np); continue; }
            cJSON *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
            cJSON_AddItemToObject(props, p->string, np);
            cJSON_AddItemToArray(req, cJSON_CreateString(p->string));
            cJSON *o = typed(T_OBJ, "properties", props);
            cJSON_AddItemToObject(o, "required", req);
            cJSON_AddItemToArray(pieces, o);
        }
        return 0;
    }
    static const struct { const char *kw, *opp; int type, delta; } counts[] = {
        {"minProperties", "maxProperties", T_OBJ, -1}, {"maxProperties", "minProperties", T_OBJ, 1},
        {"minItems", "maxItems", T_ARR, -1},           {"maxItems", "minItems", T_ARR, 1},
        {"minLength", "maxLength", T_STR, -1},         {"maxLength", "minLength", T_STR, 1}};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        if (strcmp(n, counts[i].kw)) continue;
        if (count_of(k, &x)) return FAIL(c, DI_ERR_FORMAT, "'%s' must be a non-negative integer", n);
        if (x + counts[i].delta >= 0)
            cJSON_AddItemToArray(pieces, typed(counts[i].type, counts[i].opp, cJSON_CreateNumber(x + counts[i].delta)));
        return 0;
    }
    static const char *bounds[][2] = {{"minimum", "exclusiveMaximum"}, {"maximum", "exclusiveMinimum"},
                                      {"exclusiveMinimum", "maximum"}, {"exclusiveMaximum", "minimum"}};
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++) {
        if (strcmp(n, bounds[i][0])) continue;
        if (!cJSON_IsNumber(k)) return FAIL(c, DI_ERR_FORMAT, "'%s' must be a number", n);
        cJSON_AddItemToArray(pieces, typed(T_NUM | T_INT, bounds[i][1], cJSON_CreateNumber(k->valuedouble)));
        return 0;
    }
    if (!strcmp(n, "pattern")) {
        cJSON *l = cJSON_CreateArray();
        cJSON_AddItemToArray(l, cJSON_Duplicate(k, 0));
        cJSON_AddItemToArray(pieces, typed(T_STR, "x-di-not-patterns", l));
        return 0;
    }
    if (!strcmp(n, "x-di-patterns") || !strcmp(n, "x-di-not-patterns")) {
        int pos = !strcmp(n, "x-di-patterns");
        for (const cJSON *p = k->child; p; p = p->next) {
            cJSON *l = cJSON_CreateArray();
            cJSON_AddItemToArray(l, cJSON_Duplicate(p, 0));
            cJSON_AddItemToArray(pieces, typed(T_STR, pos ? "x-di-not-patterns" : "x-di-patterns", l));
        }
        return 0;
    }
    if (!strcmp(n, "x-di-not-values")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "enum", cJSON_Duplicate(k, 1));
        cJSON_AddItemToArray(pieces, o);
        return 0;
    }
    if (!strcmp(n, "x-di-non-integer")) {
        cJSON_AddItemToArray(pieces, typed(T_INT, NULL, NULL));
        return 0;
    }
    if (!strcmp(n, "format")) {
        /* an annotation (or a format we do not check) rejects nothing */
        if (c->o->format_mode == DI_FORMAT_ANNOTATION) return 0;
        if (c->o->format_mode == DI_FORMAT_CHECKED && (!cJSON_IsString(k) || !di_js_format_checked(k->valuestring)))
            return 0;
        return FAIL(c, DI_ERR_UNSUPPORTED,
                    "JSON Schema keyword 'not' is not supported in this form: 'format' (at %s)", at(c));
    }
    if (!strcmp(n, "allOf")) {
        if (!cJSON_IsArray(k)) return FAIL(c, DI_ERR_FORMAT, "'allOf' must be an array");
        for (const cJSON *a = k->child; a; a = a->next) {
            cJSON *na = negate(c, a, depth + 1);
            if (!na) return -1;
            cJSON_AddItemToArray(pieces, na);
        }
        return 0;
    }
    if (!strcmp(n, "anyOf")) {
        if (!cJSON_IsArray(k)) return FAIL(c, DI_ERR_FORMAT, "'anyOf' must be an array");
        cJSON *all = cJSON_CreateArray();
        for (const cJSON *a = k->child; a; a = a->next) {
            cJSON *na = negate(c, a, depth + 1);
            if (!na) { cJSON_Delete(all); return -1; }
            cJSON_AddItemToArray(all, na);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "allOf", all);
        cJSON_AddItemToArray(pieces, o);
        return 0;
    }
    if (!strcmp(n, "not")) {
        cJSON_AddItemToArray(pieces, cJSON_Duplicate(k, 1));
        return 0;
    }
    if (!strcmp(n, "oneOf")) { /* no branch, or two at once */
        if (!cJSON_IsArray(k)) return FAIL(c, DI_ERR_FORMAT, "'oneOf' must be an array");
        cJSON *none = cJSON_CreateArray();
        for (const cJSON *a = k->child; a; a = a->next) {
            cJSON *na = negate(c, a, depth + 1);
            if (!na) { cJSON_Delete(none); return -1; }
            cJSON_AddItemToArray(none, na);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "allOf", none);
        cJSON_AddItemToArray(pieces, o);
        for (const cJSON *a = k->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next) {
                if (di_js_disjoint(c, a, b)) continue;
                cJSON *two = cJSON_CreateArray(), *w = cJSON_CreateObject();
                cJSON_AddItemToArray(two, cJSON_Duplicate(a, 1));
                cJSON_AddItemToArray(two, cJSON_Duplicate(b, 1));
                cJSON_AddItemToObject(w, "allOf", two);
                cJSON_AddItemToArray(pieces, w);
            }
        return 0;
    }
    if (!strcmp(n, "dependentRequired") || !strcmp(n, "dependentSchemas") || !strcmp(n, "dependencies")) {
        /* some key present without what it requires */
        if (!cJSON_IsObject(k)) return FAIL(c, DI_ERR_FORMAT, "'%s' must be an object", n);
        for (const cJSON *d = k->child; d; d = d->next) {
            if (cJSON_IsArray(d) && strcmp(n, "dependentSchemas")) {
                for (const cJSON *r = d->child; r; r = r->next) {
                    if (!cJSON_IsString(r)) return FAIL(c, DI_ERR_FORMAT, "'%s' entries must be strings", n);
                    cJSON *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
                    cJSON_AddItemToObject(props, r->valuestring, cJSON_CreateFalse());
                    cJSON_AddItemToArray(req, cJSON_CreateString(d->string));
                    cJSON *o = typed(T_OBJ, "properties", props);
                    cJSON_AddItemToObject(o, "required", req);
                    cJSON_AddItemToArray(pieces, o);
                }
            } else if ((cJSON_IsObject(d) || cJSON_IsBool(d)) && strcmp(n, "dependentRequired")) {
                cJSON *nd = negate(c, d, depth + 1);
                if (!nd) return -1;
                cJSON *req = cJSON_CreateArray(), *all = cJSON_CreateArray();
                cJSON_AddItemToArray(req, cJSON_CreateString(d->string));
                cJSON_AddItemToArray(all, nd);
                cJSON *o = typed(T_OBJ, "required", req);
                cJSON_AddItemToObject(o, "allOf", all);
                cJSON_AddItemToArray(pieces, o);
            } else return FAIL(c, DI_ERR_FORMAT, "bad value for '%s' in '%s'", d->string, n);
        }
        return 0;
    }
    if (!strcmp(n, "then") || !strcmp(n, "else")) return 0; /* with "if" */
    if (!strcmp(n, "if")) { /* (if ∧ ¬then) ∨ (¬if ∧ ¬else) */
        const cJSON *br[2] = {cJSON_GetObjectItemCaseSensitive(s, "then"), cJSON_GetObjectItemCaseSensitive(s, "else")};
        for (int b = 0; b < 2; b++) {
            if (!br[b]) continue;
            cJSON *nb = negate(c, br[b], depth + 1), *cond = b ? negate(c, k, depth + 1) : cJSON_Duplicate(k, 1);
            if (!nb || !cond) {
                cJSON_Delete(nb);
                cJSON_Delete(cond);
                return -1;
            }
            cJSON *all = cJSON_CreateArray(), *o = cJSON_CreateObject();
            cJSON_AddItemToArray(all, cond);
            cJSON_AddItemToArray(all, nb);
            cJSON_AddItemToObject(o, "allOf", all);
            cJSON_AddItemToArray(pieces, o);
        }
        return 0;
    }
    if (!strcmp(n, "$ref")) {
        if (!cJSON_IsString(k)) return FAIL(c, DI_ERR_FORMAT, "'$ref' must be a string");
        const cJSON *t = di_js_resolve_ref(c, k->valuestring);
        cJSON *nt = t ? negate(c, t, depth + 1) : NULL;
        if (!nt) return -1;
        cJSON_AddItemToArray(pieces, nt);
        return 0;
    }
    if (!strcmp(n, "contains") || !strcmp(n, "x-di-contains")) { /* every element fails it */
        cJSON *nc = negate(c, k, depth + 1);
        if (!nc) return -1;
        cJSON_AddItemToArray(pieces, typed(T_ARR, "items", nc));
        return 0;
    }
    if (!strcmp(n, "items") && !cJSON_IsArray(k) && !is_trivial(k) &&
        !cJSON_GetObjectItemCaseSensitive(s, "prefixItems")) { /* some element fails it */
        cJSON *ni = negate(c, k, depth + 1);
        if (!ni) return -1;
        if (cJSON_IsFalse(ni)) cJSON_Delete(ni);
        else cJSON_AddItemToArray(pieces, typed(T_ARR, "x-di-contains", ni));
        return 0;
    }
    if (!strcmp(n, "additionalProperties") && !is_trivial(k)) {
        /* a key beyond `properties` and `patternProperties` fails it */
        cJSON *nv = negate(c, k, depth + 1);
        if (!nv) return -1;
        if (cJSON_IsFalse(nv)) {
            cJSON_Delete(nv);
            return 0;
        }
        cJSON *x = cJSON_CreateObject(), *names = cJSON_CreateArray(), *pats = cJSON_CreateArray();
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *pp = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
        if (cJSON_IsObject(props))
            for (const cJSON *p = props->child; p; p = p->next) cJSON_AddItemToArray(names, cJSON_CreateString(p->string));
        if (cJSON_IsObject(pp))
            for (const cJSON *p = pp->child; p; p = p->next) cJSON_AddItemToArray(pats, cJSON_CreateString(p->string));
        cJSON_AddItemToObject(x, "names", names);
        cJSON_AddItemToObject(x, "patterns", pats);
        cJSON_AddItemToObject(x, "value", nv);
        cJSON_AddItemToArray(pieces, typed(T_OBJ, "x-di-some-key", x));
        return 0;
    }
    if (!strcmp(n, "patternProperties") && cJSON_IsObject(k)) { /* a key matching p whose value fails it */
        for (const cJSON *p = k->child; p; p = p->next) {
            cJSON *nv = negate(c, p, depth + 1);
            if (!nv) return -1;
            if (cJSON_IsFalse(nv)) {
                cJSON_Delete(nv);
                continue;
            }
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToObject(x, "pattern", cJSON_CreateString(p->string));
            cJSON_AddItemToObject(x, "value", nv);
            cJSON_AddItemToArray(pieces, typed(T_OBJ, "x-di-some-key", x));
        }
        return 0;
    }
    /* keywords whose trivial forms reject nothing */
    if ((!strcmp(n, "additionalProperties") || !strcmp(n, "items") || !strcmp(n, "additionalItems") ||
         !strcmp(n, "propertyNames")) && is_trivial(k))
        return 0;
    if (!strcmp(n, "patternProperties")) {
        int trivial = 1;
        for (const cJSON *p = k->child; p; p = p->next) trivial &= is_trivial(p);
        if (trivial) return 0;
    }
    if (!strcmp(n, "uniqueItems") && cJSON_IsFalse(k)) return 0;
    if (!strcmp(n, "multipleOf") && cJSON_IsNumber(k) && k->valuedouble == 1.0) {
        cJSON_AddItemToArray(pieces, typed(T_NUM | T_INT, "x-di-non-integer", cJSON_CreateTrue()));
        return 0;
    }
    return FAIL(c, DI_ERR_UNSUPPORTED, "JSON Schema keyword 'not' is not supported in this form: '%s' (at %s)", n, at(c));
}

/* ¬s as a new schema, or NULL with the error set. */
static cJSON *negate(js_ctx *c, const cJSON *s, int depth) {
    if (depth > NEG_MAX_DEPTH) {
        FAIL(c, DI_ERR_UNSUPPORTED, "JSON Schema keyword 'not' is not supported in this form: nested deeper than %d (at %s)",
             NEG_MAX_DEPTH, at(c));
        return NULL;
    }
    if (cJSON_IsTrue(s)) return cJSON_CreateFalse();
    if (cJSON_IsFalse(s)) return cJSON_CreateTrue();
    if (!cJSON_IsObject(s)) {
        FAIL(c, DI_ERR_FORMAT, "schema must be an object or a boolean");
        return NULL;
    }
    cJSON *pieces = cJSON_CreateArray();
    if (!pieces) {
        FAIL(c, DI_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (const cJSON *k = s->child; k; k = k->next) {
        if (!di_js_is_constraint(k->string)) continue;
        if (negate_keyword(c, s, k, pieces, depth)) {
            cJSON_Delete(pieces);
            return NULL;
        }
    }
    return union_of(pieces);
}

/* Instances of exactly one branch: branch i minus every branch j it may
 * share instances with. */
static cJSON *one_of_exact(js_ctx *c, const cJSON *arr) {
    int n = cJSON_GetArraySize(arr);
    cJSON **neg = calloc((size_t)n, sizeof *neg);
    cJSON *alts = cJSON_CreateArray();
    if (!neg || !alts) {
        free(neg);
        cJSON_Delete(alts);
        FAIL(c, DI_ERR_NOMEM, "out of memory");
        return NULL;
    }
    cJSON *result = NULL;
    int i = 0;
    for (const cJSON *a = arr->child; a; a = a->next, i++) {
        cJSON *conj = cJSON_CreateArray();
        cJSON_AddItemToArray(alts, conj);
        cJSON_AddItemReferenceToArray(conj, (cJSON *)a);
        int j = 0;
        for (const cJSON *b = arr->child; b; b = b->next, j++) {
            if (j == i || di_js_disjoint(c, a, b)) continue;
            if (!neg[j]) {
                neg[j] = negate(c, b, 0);
                if (!neg[j]) {
                    di_err_prefix(c->err, "oneOf whose branches may overlap is not supported (at %s): ", at(c));
                    goto done;
                }
            }
            cJSON_AddItemToArray(conj, cJSON_Duplicate(neg[j], 1));
        }
    }
    /* alts holds conjunction lists: wrap each as {"allOf": [...]} */
    result = cJSON_CreateObject();
    cJSON *any = cJSON_CreateArray();
    while (cJSON_GetArraySize(alts)) {
        cJSON *conj = cJSON_DetachItemFromArray(alts, 0);
        cJSON *w = cJSON_CreateObject();
        cJSON_AddItemToObject(w, "allOf", conj);
        cJSON_AddItemToArray(any, w);
    }
    cJSON_AddItemToObject(result, "anyOf", any);
done:
    for (int k = 0; k < n; k++) cJSON_Delete(neg[k]);
    free(neg);
    cJSON_Delete(alts);
    return result;
}

static int one_of_disjoint(js_ctx *c, const cJSON *arr) {
    for (const cJSON *a = arr->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (!di_js_disjoint(c, a, b)) return 0;
    return 1;
}

/* if / then / else: (if ∧ then) ∨ (¬if ∧ else), an absent branch being
 * true. */
static cJSON *if_then_else(js_ctx *c, const cJSON *cond, const cJSON *then, const cJSON *els) {
    cJSON *alts = cJSON_CreateArray();
    const cJSON *br[2] = {then, els};
    for (int b = 0; b < 2; b++) {
        cJSON *x = b ? negate(c, cond, 0) : cJSON_Duplicate(cond, 1);
        if (!x) {
            cJSON_Delete(alts);
            return NULL;
        }
        cJSON *all = cJSON_CreateArray(), *o = cJSON_CreateObject();
        cJSON_AddItemToArray(all, x);
        if (br[b]) cJSON_AddItemReferenceToArray(all, (cJSON *)br[b]);
        cJSON_AddItemToObject(o, "allOf", all);
        cJSON_AddItemToArray(alts, o);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "anyOf", alts);
    return o;
}

/* Property `name` absent, or present together with `then` (a schema). */
static cJSON *dependency(const char *name, cJSON *then) {
    cJSON *absent = cJSON_CreateObject(), *props = cJSON_CreateObject();
    cJSON_AddItemToObject(props, name, cJSON_CreateFalse());
    cJSON_AddItemToObject(absent, "properties", props);
    cJSON *present = cJSON_CreateObject(), *req = cJSON_CreateArray(), *all = cJSON_CreateArray();
    cJSON_AddItemToArray(req, cJSON_CreateString(name));
    cJSON_AddItemToObject(present, "required", req);
    cJSON_AddItemToArray(all, then);
    cJSON_AddItemToObject(present, "allOf", all);
    cJSON *alts = cJSON_CreateArray();
    cJSON_AddItemToArray(alts, absent);
    cJSON_AddItemToArray(alts, present);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "anyOf", alts);
    return o;
}

static int add_dependencies(js_ctx *c, const cJSON *deps, int kind, cJSON *extra) {
    /* kind: 0 dependencies (either form), 1 dependentRequired, 2 dependentSchemas */
    if (!cJSON_IsObject(deps)) return FAIL(c, DI_ERR_FORMAT, "'%s' must be an object", deps->string);
    for (const cJSON *d = deps->child; d; d = d->next) {
        cJSON *then;
        if (cJSON_IsArray(d) && kind != 2) {
            for (const cJSON *r = d->child; r; r = r->next)
                if (!cJSON_IsString(r)) return FAIL(c, DI_ERR_FORMAT, "'%s' entries must be strings", deps->string);
            then = cJSON_CreateObject();
            cJSON_AddItemToObject(then, "required", cJSON_Duplicate(d, 1));
        } else if ((cJSON_IsObject(d) || cJSON_IsBool(d)) && kind != 1) {
            then = cJSON_Duplicate(d, 1);
        } else return FAIL(c, DI_ERR_FORMAT, "bad value for '%s' in '%s'", d->string, deps->string);
        cJSON_AddItemToArray(extra, dependency(d->string, then));
    }
    return 0;
}

const cJSON *di_js_rewrite_logic(js_ctx *c, const cJSON *s) {
    if (!cJSON_IsObject(s)) return s;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(s, "not");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const char *dk[3] = {"dependencies", "dependentRequired", "dependentSchemas"};
    const cJSON *deps[3];
    int any_dep = 0;
    for (int i = 0; i < 3; i++) any_dep |= (deps[i] = cJSON_GetObjectItemCaseSensitive(s, dk[i])) != NULL;
    int one_overlap = one && cJSON_IsArray(one) && cJSON_GetArraySize(one) > 1 && !one_of_disjoint(c, one);
    const cJSON *cif = cJSON_GetObjectItemCaseSensitive(s, "if");
    const cJSON *cthen = cJSON_GetObjectItemCaseSensitive(s, "then");
    const cJSON *celse = cJSON_GetObjectItemCaseSensitive(s, "else");
    if (!n && !one_overlap && !any_dep && !cif && !cthen && !celse) return s;
    cJSON *r = di_js_own(c, cJSON_CreateObject());
    cJSON *extra = di_js_own(c, cJSON_CreateArray());
    if (!r || !extra) {
        FAIL(c, DI_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (const cJSON *k = s->child; k; k = k->next) {
        if (k == n || (k == one && one_overlap) || k == deps[0] || k == deps[1] || k == deps[2] || k == cif ||
            k == cthen || k == celse)
            continue;
        cJSON_AddItemReferenceToObject(r, k->string, (cJSON *)k);
    }
    if (n) {
        cJSON *x = negate(c, n, 0);
        if (x) cJSON_AddItemToArray(extra, x);
        else if (c->o->lenient) di_err_clear(c->err);
        else return NULL;
    }
    if (one_overlap) {
        cJSON *x = one_of_exact(c, one);
        if (x) cJSON_AddItemToArray(extra, x);
        else if (c->o->lenient) {
            di_err_clear(c->err);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemReferenceToObject(o, "anyOf", (cJSON *)one);
            cJSON_AddItemToArray(extra, o);
        } else return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (deps[i] && add_dependencies(c, deps[i], i, extra)) return NULL;
    if (cif && (cthen || celse)) {
        cJSON *x = if_then_else(c, cif, cthen, celse);
        if (x) cJSON_AddItemToArray(extra, x);
        else if (c->o->lenient) di_err_clear(c->err);
        else {
            di_err_prefix(c->err, "if/then/else: ");
            return NULL;
        }
    }
    if (!cJSON_GetArraySize(extra)) return r;
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    cJSON *nall = cJSON_CreateArray();
    if (all && cJSON_IsArray(all))
        for (const cJSON *a = all->child; a; a = a->next) cJSON_AddItemReferenceToArray(nall, (cJSON *)a);
    while (cJSON_GetArraySize(extra)) cJSON_AddItemToArray(nall, cJSON_DetachItemFromArray(extra, 0));
    cJSON_DeleteItemFromObjectCaseSensitive(r, "allOf");
    cJSON_AddItemToObject(r, "allOf", nall);
    return r;
}
