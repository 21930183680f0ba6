/* lsc_attr.h: an attribute read as PyObject_GetAttr reads it, without the
 * lookup on every read.
 *
 * Design: the walks read the same few attributes of every array of a list
 * on every call (_walk.pyx: a CuPy array's data, data.ptr, size and dtype,
 * a tensor's dtype; _grads.pyx: a parameter's grad), and each generic read
 * is a type lookup, a descriptor call and the checks around them: most of a
 * cached call's host time over many arrays.  An lsc_attrs resolves the
 * attributes once per type: a getset descriptor (what Cython makes of a cdef
 * class's readonly fields, as in CuPy, and torch's C tensor attributes) is
 * read through its getter, a __slots__ object member at its offset.  One
 * lsc_attrs holds one type: arrays of two types in turn resolve in turn.
 * The resolution holds while the type is the same object with the same
 * version tag (CPython gives a type a new tag whenever it or a base
 * changes), and is made only for types that read attributes generically
 * (tp_getattro is PyObject_GenericGetAttr: no __getattribute__ of their
 * own), where a data descriptor found on the type is exactly what the
 * generic read would call.  Anything else, or an unset slot, takes
 * PyObject_GetAttr: the same value, the same errors.
 */
#ifndef LSC_ATTR_H
#define LSC_ATTR_H

#include <Python.h>
#include <structmember.h>

#define LSC_ATTRS 8

enum { LSC_ATTR_GENERIC = 0, LSC_ATTR_GETSET = 1, LSC_ATTR_SLOT = 2 };

typedef struct {
    int kind;
    getter get;         /* LSC_ATTR_GETSET */
    void *closure;
    Py_ssize_t offset;  /* LSC_ATTR_SLOT */
} lsc_attr;

/* up to LSC_ATTRS attributes of one type (every read through one lsc_attrs
 * passes the same names); type NULL: nothing resolved yet */
typedef struct {
    PyTypeObject *type; /* compared, never dereferenced unless it is the object's type */
    unsigned int version;
    lsc_attr a[LSC_ATTRS];
} lsc_attrs;

static void lsc_attr_resolve(PyTypeObject *tp, PyObject *name, lsc_attr *out)
{
    PyObject *d;
    out->kind = LSC_ATTR_GENERIC;
    d = _PyType_Lookup(tp, name); /* borrowed; sets no exception */
    if (d == NULL)
        return;
    if (Py_IS_TYPE(d, &PyGetSetDescr_Type)) {
        PyGetSetDef *g = ((PyGetSetDescrObject *)d)->d_getset;
        if (g->get != NULL) {
            out->kind = LSC_ATTR_GETSET;
            out->get = g->get;
            out->closure = g->closure;
        }
    } else if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        /* an object slot at an absolute offset, read without an audit hook */
        if ((m->type == T_OBJECT_EX || m->type == T_OBJECT) && (m->flags & ~READONLY) == 0) {
            out->kind = LSC_ATTR_SLOT;
            out->offset = m->offset;
        }
    }
}

/* Whether `c` holds the resolution of type `tp` (resolving it when it can be
 * kept: the type reads generically and has a valid version tag). */
static int lsc_attrs_for(lsc_attrs *c, PyTypeObject *tp, PyObject *const *names, int n)
{
    if (c->type == tp && c->version == tp->tp_version_tag &&
        (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return 1;
    c->type = NULL;
    if (tp->tp_getattro != PyObject_GenericGetAttr)
        return 0;
    for (int i = 0; i < n; i++)
        lsc_attr_resolve(tp, names[i], &c->a[i]);
    /* the lookups assign a tag when the type has none */
    if (!(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || tp->tp_version_tag == 0)
        return 0;
    c->type = tp;
    c->version = tp->tp_version_tag;
    return 1;
}

/* Attribute `i` of `x` (a new reference, or NULL with an exception set):
 * through the resolution in `c` when it is x's type's, else PyObject_GetAttr. */
static inline PyObject *lsc_attr_get(lsc_attrs *c, PyObject *const *names, int n, PyObject *x,
                                     int i)
{
    if (lsc_attrs_for(c, Py_TYPE(x), names, n)) {
        const lsc_attr *a = &c->a[i];
        if (a->kind == LSC_ATTR_GETSET)
            return a->get(x, a->closure);
        if (a->kind == LSC_ATTR_SLOT) {
            PyObject *v = *(PyObject **)((char *)x + a->offset);
            if (v != NULL) {
                Py_INCREF(v);
                return v;
            }
        }
    }
    return PyObject_GetAttr(x, names[i]);
}

#endif
