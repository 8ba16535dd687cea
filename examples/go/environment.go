package main

// The PROCMESH_* check every procmesh process makes at start (docs/running.md, "Environment
// variables"), done the way the Python and Node SDKs do it: a variable this sidecar reads is read;
// another component's (a Kubernetes ConfigMap shared through envFrom puts the orchestrator's here)
// is named in one log line and not read; any other PROCMESH_* name is a typo or a retired name, and
// the sidecar refuses to start, naming it and the closest known name. environment.json is a copy of
// the Python SDK's list (procmesh.environment); tests/unit/test_docs_environment.py keeps it equal.

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

//go:embed environment.json
var environmentJSON []byte

const envPrefix = "PROCMESH_"

// ownVariables are the variables this sidecar reads: each flag's, as in the SDKs.
var ownVariables = []string{"PROCMESH_LISTEN", "PROCMESH_GRACE_SECONDS"}

type knownVariables struct {
	Components map[string][]string `json:"components"`
	Prefixes   map[string][]string `json:"prefixes"`
	Renamed    map[string]string   `json:"renamed"`
}

// environmentCheck sorts an environment's PROCMESH_* variables: unknown (no component reads them)
// and foreign (another component's).
type environmentCheck struct {
	unknown, foreign []string
	known            knownVariables
}

func loadKnown() knownVariables {
	var known knownVariables
	if err := json.Unmarshal(environmentJSON, &known); err != nil {
		panic(fmt.Sprintf("environment.json: %v", err)) // a broken build, not a user's error
	}
	return known
}

func (k knownVariables) knownTo(component, name string) bool {
	for _, n := range k.Components[component] {
		if n == name {
			return true
		}
	}
	for _, p := range k.Prefixes[component] {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// checkEnvironment sorts environ (os.Environ()'s NAME=value strings) against the list.
func checkEnvironment(environ []string) environmentCheck {
	check := environmentCheck{known: loadKnown()}
	names := []string{}
	for _, entry := range environ {
		name, _, _ := strings.Cut(entry, "=")
		if strings.HasPrefix(name, envPrefix) && !contains(ownVariables, name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		_, renamed := check.known.Renamed[name]
		foreign := false
		for component := range check.known.Components {
			foreign = foreign || (!renamed && check.known.knownTo(component, name))
		}
		if foreign {
			check.foreign = append(check.foreign, name)
		} else {
			check.unknown = append(check.unknown, name)
		}
	}
	return check
}

// error is the one line naming every unknown variable and what was probably meant; "" when none.
func (c environmentCheck) error() string {
	if len(c.unknown) == 0 {
		return ""
	}
	all := []string{}
	for _, names := range c.known.Components {
		all = append(all, names...)
	}
	described := make([]string, len(c.unknown))
	for i, name := range c.unknown {
		if renamed, ok := c.known.Renamed[name]; ok {
			described[i] = fmt.Sprintf("%s (renamed %s)", name, renamed)
		} else if near := closest(name, ownVariables); near != "" {
			described[i] = fmt.Sprintf("%s (did you mean %s?)", name, near)
		} else if near := closest(name, all); near != "" {
			described[i] = fmt.Sprintf("%s (did you mean %s?)", name, near)
		} else {
			described[i] = name
		}
	}
	s, them := "", "it"
	if len(described) > 1 {
		s, them = "s", "them"
	}
	return fmt.Sprintf("unknown environment variable%s %s: no procmesh component reads %s (unset it, "+
		"or fix its name; the variables are listed in docs/running.md)", s, strings.Join(described, ", "), them)
}

// note is the log line naming another component's variables (not read here); "" when none.
func (c environmentCheck) note() string {
	if len(c.foreign) == 0 {
		return ""
	}
	return strings.Join(c.foreign, ", ") +
		": other procmesh components' settings (a shared ConfigMap?), not read by the go-sidecar"
}

// closest is the candidate nearest to name, if close enough to be a typo (at most a quarter of the
// name's characters differ, as the Node SDK decides); "" otherwise.
func closest(name string, candidates []string) string {
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestDistance := "", len(name)+1000
	for _, candidate := range sorted {
		if d := distance(name, candidate); d < bestDistance {
			best, bestDistance = candidate, d
		}
	}
	limit := len(name) / 4
	if limit < 2 {
		limit = 2
	}
	if best == "" || bestDistance > limit {
		return ""
	}
	return best
}

// distance is the Levenshtein distance between a and b (the names are ASCII).
func distance(a, b string) int {
	row := make([]int, len(b)+1)
	for j := range row {
		row[j] = j
	}
	for i := 1; i <= len(a); i++ {
		next := make([]int, len(b)+1)
		next[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			next[j] = min3(row[j]+1, next[j-1]+1, row[j-1]+cost)
		}
		row = next
	}
	return row[len(b)]
}

func min3(a, b, c int) int {
	if b < a {
		a = b
	}
	if c < a {
		a = c
	}
	return a
}

func contains(list []string, name string) bool {
	for _, n := range list {
		if n == name {
			return true
		}
	}
	return false
}
