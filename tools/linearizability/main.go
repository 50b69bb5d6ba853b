// likes-linearizability: checks a chaos run's client history, edge by edge, for
// linearizability with Porcupine (github.com/anishathalye/porcupine), and writes Porcupine's
// HTML visualization of every edge whose history is not linearizable.
//
// An edge (item, user) is a register with request keys, as docs/design.md's "One Paxos round
// per write" specifies it: a like or unlike whose key the edge already holds replays the
// answer stored with it and changes nothing; any other sets the state, adds 1 to op_id when
// the state changes, and stores its key with its answer. The actor's read answers the state.
// An operation whose outcome the client does not know (a timeout, a 5xx, a broken
// connection) may take effect at any time after its call, or never: it is given a return after
// every other operation and accepts any answer (Porcupine's usual treatment).
//
// Input: JSON lines, one operation each (tools/src/chaos/history.rs writes them).
// Output: a JSON summary on stdout; exit 0 when every edge is linearizable, 1 when one is
// not, 2 when the history cannot be read.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Record is one operation as the chaos client recorded it.
type Record struct {
	Item   string `json:"item"`
	User   string `json:"user"`
	Op     string `json:"op"` // like, unlike, read
	Key    string `json:"key"`
	Client int    `json:"client"`
	CallUs int64  `json:"call_us"`
	// Nil: the outcome is unknown.
	ReturnUs *int64 `json:"return_us"`
	Liked    bool   `json:"liked"`
	Changed  bool   `json:"changed"`
	OpID     int64  `json:"op_id"`
}

// Summary is what the checker found.
type Summary struct {
	Operations int `json:"operations"`
	Unknown    int `json:"unknown_outcomes"`
	Edges      int `json:"edges"`
	// Edges whose history is linearizable.
	Linearizable int `json:"linearizable"`
	// Edges whose history is not: a client saw something no order of the operations explains.
	Illegal int `json:"illegal"`
	// Edges the checker gave up on within its timeout (neither proven nor refuted).
	TimedOut     int      `json:"timed_out"`
	IllegalEdges []string `json:"illegal_edges"`
	// Porcupine's visualization of the illegal edges, when any.
	Visualization string `json:"visualization,omitempty"`
}

func main() {
	history := flag.String("history", "", "the JSON-lines history to check")
	out := flag.String("visualization", "", "where to write the HTML visualization of illegal edges (default: beside the history)")
	timeout := flag.Duration("timeout", 10*time.Second, "the most one edge's check may take")
	flag.Parse()
	if *history == "" {
		fmt.Fprintln(os.Stderr, "usage: likes-linearizability -history FILE [-visualization FILE.html] [-timeout 10s]")
		os.Exit(2)
	}
	records, err := read(*history)
	if err != nil {
		fmt.Fprintf(os.Stderr, "likes-linearizability: %v\n", err)
		os.Exit(2)
	}
	if *out == "" {
		*out = filepath.Join(filepath.Dir(*history), "linearizability.html")
	}
	summary, err := check(records, *timeout, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "likes-linearizability: %v\n", err)
		os.Exit(2)
	}
	text, _ := json.Marshal(summary)
	fmt.Println(string(text))
	if summary.Illegal > 0 {
		os.Exit(1)
	}
}

func read(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var records []Record
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; scanner.Scan(); line++ {
		if len(scanner.Bytes()) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(scanner.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if r.Op != "like" && r.Op != "unlike" && r.Op != "read" {
			return nil, fmt.Errorf("%s:%d: op %q is none of like, unlike, read", path, line, r.Op)
		}
		records = append(records, r)
	}
	return records, scanner.Err()
}

// check runs Porcupine per edge, then once more over the illegal edges for the visualization.
func check(records []Record, timeout time.Duration, visualization string) (Summary, error) {
	var end int64
	for _, r := range records {
		if r.ReturnUs != nil && *r.ReturnUs > end {
			end = *r.ReturnUs
		}
		if r.CallUs > end {
			end = r.CallUs
		}
	}
	byEdge := map[string][]porcupine.Operation{}
	s := Summary{Operations: len(records), IllegalEdges: []string{}}
	for _, r := range records {
		op := porcupine.Operation{
			ClientId: r.Client,
			Input:    Input{Op: r.Op, Key: r.Key},
			Call:     r.CallUs,
			Metadata: r.Item + "/" + r.User,
		}
		if r.ReturnUs == nil {
			s.Unknown++
			op.Output = Output{}
			op.Return = end + 1
		} else {
			op.Output = Output{Known: true, Liked: r.Liked, Changed: r.Changed, OpID: r.OpID}
			op.Return = *r.ReturnUs
		}
		edge := r.Item + "/" + r.User
		byEdge[edge] = append(byEdge[edge], op)
	}
	edges := make([]string, 0, len(byEdge))
	for e := range byEdge {
		edges = append(edges, e)
	}
	sort.Strings(edges)
	s.Edges = len(edges)
	var illegal []porcupine.Operation
	for _, e := range edges {
		switch porcupine.CheckOperationsTimeout(Edge, byEdge[e], timeout) {
		case porcupine.Ok:
			s.Linearizable++
		case porcupine.Illegal:
			s.Illegal++
			s.IllegalEdges = append(s.IllegalEdges, e)
			illegal = append(illegal, byEdge[e]...)
		default:
			s.TimedOut++
		}
	}
	if len(illegal) > 0 && visualization != "" {
		model := Edge
		model.Partition = byMetadata
		_, info := porcupine.CheckOperationsVerbose(model, illegal, timeout)
		if err := porcupine.VisualizePath(model, info, visualization); err != nil {
			return s, fmt.Errorf("visualization: %v", err)
		}
		s.Visualization = visualization
	}
	return s, nil
}

// byMetadata partitions a history by edge (each operation's Metadata names it).
func byMetadata(history []porcupine.Operation) [][]porcupine.Operation {
	parts := map[string][]porcupine.Operation{}
	var order []string
	for _, op := range history {
		k := op.Metadata.(string)
		if _, seen := parts[k]; !seen {
			order = append(order, k)
		}
		parts[k] = append(parts[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(order))
	for _, k := range order {
		out = append(out, parts[k])
	}
	return out
}
