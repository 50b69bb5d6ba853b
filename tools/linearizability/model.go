package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Input is what a client asked of an edge.
type Input struct {
	Op  string // like, unlike, read
	Key string // the request key (writes)
}

// Output is what the client was answered; Known false for an unknown outcome.
type Output struct {
	Known   bool
	Liked   bool
	Changed bool
	OpID    int64
}

// Answer is a write's answer as the edge row stores it with its key.
type Answer struct {
	Liked   bool
	Changed bool
	OpID    int64
}

// State is one edge: its state, its op_id, and the request keys it holds with their
// answers, as one comparable value (Keys is canonical: sorted, one "key liked changed op_id"
// per line), so Porcupine's default equality applies.
type State struct {
	Liked bool
	OpID  int64
	Keys  string
}

func (s State) answerOf(key string) (Answer, bool) {
	if s.Keys == "" {
		return Answer{}, false
	}
	for _, line := range strings.Split(s.Keys, "\n") {
		var k string
		var a Answer
		if _, err := fmt.Sscanf(line, "%s %t %t %d", &k, &a.Liked, &a.Changed, &a.OpID); err == nil && k == key {
			return a, true
		}
	}
	return Answer{}, false
}

func (s State) withKey(key string, a Answer) string {
	lines := []string{}
	if s.Keys != "" {
		lines = strings.Split(s.Keys, "\n")
	}
	lines = append(lines, fmt.Sprintf("%s %t %t %d", key, a.Liked, a.Changed, a.OpID))
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// step is the edge's sequential specification.
func step(state, input, output interface{}) (bool, interface{}) {
	s := state.(State)
	in := input.(Input)
	out := output.(Output)
	if in.Op == "read" {
		return !out.Known || out.Liked == s.Liked, s
	}
	if stored, ok := s.answerOf(in.Key); ok {
		// A retry: the stored answer, nothing written.
		return !out.Known || (Answer{out.Liked, out.Changed, out.OpID} == stored), s
	}
	liked := in.Op == "like"
	a := Answer{Liked: liked, Changed: liked != s.Liked, OpID: s.OpID}
	if a.Changed {
		a.OpID++
	}
	next := State{Liked: liked, OpID: a.OpID, Keys: s.withKey(in.Key, a)}
	return !out.Known || (Answer{out.Liked, out.Changed, out.OpID} == a), next
}

// Edge is the model of one edge; an edge that was never written is unliked at op_id 0.
var Edge = porcupine.Model{
	Init: func() interface{} { return State{} },
	Step: step,
	DescribeOperation: func(input, output interface{}) string {
		in := input.(Input)
		out := output.(Output)
		answer := "?"
		if out.Known {
			if in.Op == "read" {
				answer = fmt.Sprintf("liked=%t", out.Liked)
			} else {
				answer = fmt.Sprintf("liked=%t changed=%t op_id=%d", out.Liked, out.Changed, out.OpID)
			}
		}
		if in.Op == "read" {
			return "read -> " + answer
		}
		return fmt.Sprintf("%s [%s] -> %s", in.Op, in.Key, answer)
	},
	DescribeState: func(state interface{}) string {
		s := state.(State)
		keys := 0
		if s.Keys != "" {
			keys = strings.Count(s.Keys, "\n") + 1
		}
		return fmt.Sprintf("liked=%t op_id=%d keys=%d", s.Liked, s.OpID, keys)
	},
}
