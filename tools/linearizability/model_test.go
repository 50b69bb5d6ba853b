package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func ret(us int64) *int64 { return &us }

func like(key string, call int64, r *int64, changed bool, opID int64) Record {
	return Record{Item: "i", User: "u", Op: "like", Key: key, CallUs: call, ReturnUs: r, Liked: true, Changed: changed, OpID: opID}
}

func unlike(key string, call int64, r *int64, changed bool, opID int64) Record {
	return Record{Item: "i", User: "u", Op: "unlike", Key: key, CallUs: call, ReturnUs: r, Liked: false, Changed: changed, OpID: opID}
}

func readOp(call int64, r *int64, liked bool) Record {
	return Record{Item: "i", User: "u", Op: "read", CallUs: call, ReturnUs: r, Liked: liked, Client: 1}
}

func run(t *testing.T, records []Record) Summary {
	t.Helper()
	viz := filepath.Join(t.TempDir(), "v.html")
	s, err := check(records, 5*time.Second, viz)
	if err != nil {
		t.Fatal(err)
	}
	if s.Illegal > 0 {
		if st, err := os.Stat(viz); err != nil || st.Size() == 0 {
			t.Fatalf("an illegal history must leave its visualization: %v", err)
		}
	}
	return s
}

func TestLinearizableHistoriesPass(t *testing.T) {
	cases := map[string][]Record{
		"like, read, unlike, read": {
			like("k1", 0, ret(10), true, 1), readOp(11, ret(20), true),
			unlike("k2", 21, ret(30), true, 2), readOp(31, ret(40), false),
		},
		// A retry of an old like after the unlike replays its answer and changes nothing.
		"a late retry does not like again": {
			like("k1", 0, ret(10), true, 1), unlike("k2", 11, ret(20), true, 2),
			like("k1", 21, ret(30), true, 1), readOp(31, ret(40), false),
		},
		// A read concurrent with the like may see either state.
		"a read beside the write": {
			like("k1", 0, ret(10), true, 1), readOp(5, ret(8), false),
		},
		// An unknown like may land after a read that did not see it.
		"an unknown outcome lands late": {
			like("k1", 0, nil, false, 0), readOp(20, ret(30), false), readOp(40, ret(50), true),
		},
		// Or never.
		"an unknown outcome never lands": {
			like("k1", 0, nil, false, 0), readOp(20, ret(30), false), readOp(40, ret(50), false),
		},
		"an unlike of an edge never liked": {
			unlike("k1", 0, ret(10), false, 0), like("k2", 11, ret(20), true, 1),
		},
	}
	for name, h := range cases {
		if s := run(t, h); s.Illegal != 0 || s.Linearizable != 1 {
			t.Errorf("%s: %+v, want linearizable", name, s)
		}
	}
}

// The checker must be able to fail: each of these histories is one no order explains.
func TestNonLinearizableHistoriesFail(t *testing.T) {
	cases := map[string][]Record{
		// An acknowledged like lost: the actor's read after it says unliked.
		"an acknowledged like lost": {
			like("k1", 0, ret(10), true, 1), readOp(20, ret(30), false),
		},
		// A read going back in time.
		"a stale read after a fresh one": {
			like("k1", 0, ret(10), true, 1), unlike("k2", 11, ret(20), true, 2),
			readOp(21, ret(25), false), readOp(26, ret(30), true),
		},
		// Two flips answered with one op_id.
		"a flip counted twice": {
			like("k1", 0, ret(10), true, 1), unlike("k2", 11, ret(20), true, 1),
		},
		// A retry that liked again after the unlike.
		"a retry applied twice": {
			like("k1", 0, ret(10), true, 1), unlike("k2", 11, ret(20), true, 2),
			like("k1", 21, ret(30), true, 3),
		},
	}
	for name, h := range cases {
		if s := run(t, h); s.Illegal != 1 || len(s.IllegalEdges) != 1 || s.IllegalEdges[0] != "i/u" {
			t.Errorf("%s: %+v, want the edge illegal", name, s)
		}
	}
}

// Edges are checked apart: one bad edge does not hide behind a good one.
func TestEdgesAreCheckedApart(t *testing.T) {
	good := like("k1", 0, ret(10), true, 1)
	good.User = "v"
	h := []Record{good, like("k1", 0, ret(10), true, 1), readOp(20, ret(30), false)}
	s := run(t, h)
	if s.Edges != 2 || s.Illegal != 1 || s.Linearizable != 1 || s.IllegalEdges[0] != "i/u" {
		t.Fatalf("%+v", s)
	}
}
