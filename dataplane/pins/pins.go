// Package pins keeps the data plane's pinned maps across upgrades that change
// their layout. It sits between a bpf2go CollectionSpec and bpffs: before the
// program loads, Open finds or makes every pinned map under a name that carries
// its layout (Version), carries the state of an older layout over (the same map
// where the layout is unchanged, entry by entry where a conversion is defined),
// and hands the maps to the loader; once the new program runs on the pinned
// link, Set.Finish copies what the old program wrote meanwhile and removes the
// old pins. Like Cilium's ':pending' maps: the old maps stay pinned, and the old
// program keeps forwarding from them, until the new program has taken over.
package pins

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"
)

// Sep separates a map's name from its layout version in a pin's name:
// flows@<entry>-<shape> (bpffs takes no dots in names).
const Sep = "@"

// Map is how one map of a spec is pinned.
type Map struct {
	Name string
	// Meaning is what an entry means beyond the shape the spec gives it (a
	// ring layout, a ring size): part of the layout, so a change of it makes a
	// new map, as a change of the entry's bytes does.
	Meaning string
	// State: the map holds state that must outlive the agent (per-flow pins,
	// ids, rings). A changed layout without a conversion is logged as a warning
	// (Outcome Lost), not only noted.
	State bool
	// Legacy: a pin without a version (made before pins carried one) of the
	// same type, key and value size holds this layout: it is taken over. False
	// where that cannot be told from the map alone (another ring size): its
	// state is lost.
	Legacy bool
}

// Convert turns one entry of an older layout into this version's (for a per-CPU
// map, one CPU's value at a time); ok false drops the entry.
type Convert func(key, value []byte) (newKey, newValue []byte, ok bool)

// Conversions are the conversions this version defines: by map name, then by
// the older layout's entry version (the part of Version before the dash).
type Conversions map[string]map[string]Convert

// Options configure Open.
type Options struct {
	Dir string // the bpffs directory
	// Link is the pin of the link that runs the program (in Dir), through
	// which Open tells which pins the running program uses: those hold the
	// live state, whatever other versions lie beside them.
	Link    string
	Maps    []Map
	Convert Conversions
	Log     *zap.Logger
}

// Outcome is what Open did with one map.
type Outcome string

const (
	// New: no pin of the map existed.
	New Outcome = "new"
	// Kept: the pin of this layout was reused.
	Kept Outcome = "kept"
	// Adopted: a pin without a version, of this layout, was reused and
	// pinned under its versioned name.
	Adopted Outcome = "adopted"
	// Migrated: the entries of an older layout were copied into a new map
	// (as they are where only the map's size or flags changed, else through
	// a conversion).
	Migrated Outcome = "migrated"
	// Lost: an older layout with no conversion: the map starts empty.
	Lost Outcome = "lost"
)

// Outcomes lists every Outcome (metric labels).
var Outcomes = []Outcome{New, Kept, Adopted, Migrated, Lost}

// Result is what Open did with one map.
type Result struct {
	Map     string
	From    string // the pin the state came from ("" for New)
	To      string // the pin the program uses
	Outcome Outcome
	Entries int // entries copied (Migrated) or left behind (Lost)
	Dropped int // entries a conversion dropped or that failed to copy
}

// Set is the maps Open found or made, for the loader.
type Set struct {
	// Maps are the maps by name, for ebpf.CollectionOptions.MapReplacements.
	Maps    map[string]*ebpf.Map
	Results []Result
	// Live: a pinned link ran a program when Open looked: Finish must wait
	// until the new program replaced it.
	Live bool

	dir  string
	log  *zap.Logger
	olds []old
}

// old is a pin to remove after the swap, and what to copy from it first.
type old struct {
	path    string
	from    *ebpf.Map // the map it pins, open; nil: nothing to copy
	to      *ebpf.Map
	name    string
	convert Convert
}

// Version is a map's layout: the version of its entries (key and value: their
// sizes and the types' members by name, offset and size; the inner map of a map
// of maps; meaning) and of its shape (type, max entries, flags), as
// <entry>-<shape>, eight hex digits each. Computed from the spec, so no change
// goes unnoticed: where only the shape differs the entries copy as they are.
func Version(ms *ebpf.MapSpec, meaning string) string {
	return sum(entryText(ms, meaning)) + "-" + sum(shapeText(ms))
}

func entryText(ms *ebpf.MapSpec, meaning string) string {
	s := fmt.Sprintf("key %d %s value %d %s meaning %q", ms.KeySize, typeText(ms.Key, 0), ms.ValueSize, typeText(ms.Value, 0), meaning)
	if ms.InnerMap != nil {
		s += " inner {" + entryText(ms.InnerMap, "") + " " + shapeText(ms.InnerMap) + "}"
	}
	return s
}

func shapeText(ms *ebpf.MapSpec) string {
	return fmt.Sprintf("type %s max %d flags %#x", ms.Type, ms.MaxEntries, ms.Flags)
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:4])
}

// typeText describes a BTF type by what its bytes hold: members by name,
// offset and type; integers by size and sign; enums by size (new values
// appended keep the layout). Names of types and typedefs do not count.
func typeText(t btf.Type, depth int) string {
	if t == nil {
		return "-"
	}
	if depth > 8 {
		return "..."
	}
	switch v := btf.UnderlyingType(t).(type) {
	case *btf.Int:
		return fmt.Sprintf("int%d%s", v.Size*8, map[bool]string{true: "s", false: "u"}[v.Encoding&btf.Signed != 0])
	case *btf.Enum:
		return fmt.Sprintf("enum%d", v.Size*8)
	case *btf.Array:
		return fmt.Sprintf("[%d]%s", v.Nelems, typeText(v.Type, depth+1))
	case *btf.Pointer:
		return "ptr"
	case *btf.Struct:
		return "struct" + membersText(v.Size, v.Members, depth)
	case *btf.Union:
		return "union" + membersText(v.Size, v.Members, depth)
	default:
		return fmt.Sprintf("%T", v)
	}
}

func membersText(size uint32, ms []btf.Member, depth int) string {
	parts := make([]string, 0, len(ms))
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s@%d:%d %s", m.Name, m.Offset, m.BitfieldSize, typeText(m.Type, depth+1)))
	}
	return fmt.Sprintf("%d{%s}", size, strings.Join(parts, "; "))
}

// PinName is the name of a map's pin of one layout.
func PinName(name, version string) string { return name + Sep + version }

// entryOf is the entry part of a version ("" for a pin without one).
func entryOf(version string) string {
	e, _, _ := strings.Cut(version, "-")
	return e
}

// Find returns the path of the pin of map name in dir for a reader: the one of
// version if it exists, else the only versioned pin of name, else the pin
// without a version.
func Find(dir, name, version string) (string, error) {
	p := filepath.Join(dir, PinName(name, version))
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	found, err := pinsOf(dir, name)
	if err != nil {
		return "", err
	}
	var versioned []string
	for _, f := range found {
		if f != filepath.Join(dir, name) {
			versioned = append(versioned, f)
		}
	}
	switch {
	case len(versioned) == 1:
		return versioned[0], nil
	case len(versioned) > 1:
		return "", fmt.Errorf("find pinned map %s in %s: %d layouts pinned, none of this version's (%s): an upgrade is under way", name, dir, len(versioned), version)
	case len(found) == 1:
		return found[0], nil
	}
	return "", fmt.Errorf("find pinned map %s in %s: %w", name, dir, os.ErrNotExist)
}

// pinsOf lists the pins of map name in dir: without a version, and of every
// version.
func pinsOf(dir, name string) ([]string, error) {
	var out []string
	if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
		out = append(out, filepath.Join(dir, name))
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), name+Sep) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// Remove unpins every layout of the named maps in dir.
func Remove(dir string, names ...string) error {
	var errs []error
	for _, n := range names {
		found, err := pinsOf(dir, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, p := range found {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove pin %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// liveMaps returns the maps the program on the pinned link at path uses, or
// nil if no link is pinned there.
func liveMaps(path string) (map[ebpf.MapID]bool, error) {
	if path == "" {
		return nil, nil
	}
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load pinned link %s: %w", path, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("read pinned link %s: %w", path, err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return nil, fmt.Errorf("open the program of pinned link %s: %w", path, err)
	}
	defer prog.Close()
	pi, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("read the program of pinned link %s: %w", path, err)
	}
	ids, _ := pi.MapIDs()
	live := map[ebpf.MapID]bool{}
	for _, id := range ids {
		live[id] = true
	}
	return live, nil
}

// Open finds or makes the pinned maps of spec that opts.Maps name. Errors are
// the kernel's or bpffs's (a map that cannot be created or pinned); an older
// layout never makes Open fail: its state is carried over or reported lost.
func Open(spec *ebpf.CollectionSpec, opts Options) (*Set, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	live, err := liveMaps(opts.Link)
	if err != nil {
		return nil, err
	}
	s := &Set{Maps: map[string]*ebpf.Map{}, Live: live != nil, dir: opts.Dir, log: opts.Log}
	for _, m := range opts.Maps {
		ms, ok := spec.Maps[m.Name]
		if !ok {
			s.Close()
			return nil, fmt.Errorf("pin map %s: not in the spec", m.Name)
		}
		if err := s.open(ms, m, live, opts.Convert[m.Name]); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// candidate is one existing pin of a map.
type candidate struct {
	path, version string // version "" for a pin without one
	m             *ebpf.Map
	id            ebpf.MapID
}

func (s *Set) open(ms *ebpf.MapSpec, m Map, live map[ebpf.MapID]bool, convs map[string]Convert) error {
	ms = ms.Copy()
	ms.Pinning = ebpf.PinNone
	version := Version(ms, m.Meaning)
	curPath := filepath.Join(s.dir, PinName(m.Name, version))
	paths, err := pinsOf(s.dir, m.Name)
	if err != nil {
		return err
	}
	var cur *candidate
	var others []candidate
	for _, p := range paths {
		pm, err := ebpf.LoadPinnedMap(p, nil)
		if err != nil {
			// Not a map (or unreadable): it holds no state this version can use.
			s.log.Warn("pinned map unreadable: removing it", zap.String("map", m.Name), zap.String("pin", p), zap.Error(err))
			os.Remove(p)
			continue
		}
		c := candidate{path: p, m: pm}
		if info, err := pm.Info(); err == nil {
			c.id, _ = info.ID()
		}
		if v, ok := strings.CutPrefix(filepath.Base(p), m.Name+Sep); ok {
			c.version = v
		}
		if p == curPath {
			if err := ms.Compatible(pm); err != nil {
				// Its name says this layout, its kernel object does not: it
				// holds nothing this version can trust, and its name is needed.
				s.log.Warn("pinned map does not have the layout its name says: replacing it", zap.String("map", m.Name),
					zap.String("pin", p), zap.Error(err))
				if err := pm.Unpin(); err != nil {
					pm.Close()
					return fmt.Errorf("unpin map %s: %w", p, err)
				}
				pm.Close()
				continue
			}
			cur = &c
			continue
		}
		others = append(others, c)
	}
	// The running program's maps hold the live state: a pin of this layout
	// that it does not use is stale (left by an upgrade that never swapped
	// the program, or before a downgrade).
	var src *candidate
	if live != nil {
		for i := range others {
			if live[others[i].id] {
				src = &others[i]
			}
		}
		if src != nil && cur != nil && !live[cur.id] {
			s.log.Warn("a pinned map of this layout is not the running program's: replacing it", zap.String("map", m.Name),
				zap.String("pin", cur.path), zap.String("live", src.path))
			cur.m.Unpin()
			cur.m.Close()
			cur = nil
		}
	}
	if cur != nil {
		return s.keep(m, *cur, others)
	}
	if src == nil {
		src = newest(others)
	}
	if src == nil {
		nm, err := create(ms, curPath)
		if err != nil {
			return err
		}
		s.Maps[m.Name] = nm
		s.Results = append(s.Results, Result{Map: m.Name, To: curPath, Outcome: New})
		return nil
	}
	return s.carry(ms, m, version, curPath, *src, others, convs)
}

// keep uses the pin of this layout; the others go after the swap.
func (s *Set) keep(m Map, cur candidate, others []candidate) error {
	s.Maps[m.Name] = cur.m
	s.Results = append(s.Results, Result{Map: m.Name, From: cur.path, To: cur.path, Outcome: Kept})
	for _, o := range others {
		s.olds = append(s.olds, old{path: o.path, name: m.Name})
		o.m.Close()
	}
	return nil
}

// newest is the pin most recently made, nil if none.
func newest(cs []candidate) *candidate {
	var best *candidate
	var bestTime int64
	for i := range cs {
		st, err := os.Stat(cs[i].path)
		if err != nil {
			continue
		}
		if t := st.ModTime().UnixNano(); best == nil || t > bestTime {
			best, bestTime = &cs[i], t
		}
	}
	return best
}

func create(ms *ebpf.MapSpec, path string) (*ebpf.Map, error) {
	nm, err := ebpf.NewMap(ms)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", ms.Name, err)
	}
	if err := nm.Pin(path); err != nil {
		nm.Close()
		return nil, fmt.Errorf("pin map %s: %w", ms.Name, err)
	}
	return nm, nil
}

// carry makes the map of this layout from src, an older pin.
func (s *Set) carry(ms *ebpf.MapSpec, m Map, version, curPath string, src candidate, others []candidate, convs map[string]Convert) error {
	for _, o := range others {
		if o.path != src.path {
			s.olds = append(s.olds, old{path: o.path, name: m.Name})
			o.m.Close()
		}
	}
	sameSizes := func() bool {
		info, err := src.m.Info()
		return err == nil && info.Type == ms.Type && info.KeySize == ms.KeySize && info.ValueSize == ms.ValueSize
	}
	var convert Convert
	switch {
	case src.version == "" && m.Legacy && ms.Compatible(src.m) == nil && src.id != 0:
		// The same map, pinned under its versioned name too: nothing moves.
		adopted, err := ebpf.NewMapFromID(src.id)
		if err == nil {
			err = adopted.Pin(curPath)
		}
		if err != nil {
			return fmt.Errorf("pin map %s as %s: %w", m.Name, curPath, err)
		}
		s.Maps[m.Name] = adopted
		s.olds = append(s.olds, old{path: src.path, name: m.Name})
		src.m.Close()
		s.Results = append(s.Results, Result{Map: m.Name, From: src.path, To: curPath, Outcome: Adopted})
		s.log.Info("pinned map taken over from a version without layout versions", zap.String("map", m.Name), zap.String("to", curPath))
		return nil
	case !copyable(ms.Type):
		// Sockets and programs read back as ids, which no update takes.
	case src.version == "" && m.Legacy && sameSizes(), src.version != "" && entryOf(src.version) == entryOf(version) && sameSizes():
		convert = identity
	case src.version != "" && convs[entryOf(src.version)] != nil && ms.InnerMap == nil:
		convert = convs[entryOf(src.version)]
	}
	nm, err := create(ms, curPath)
	if err != nil {
		src.m.Close()
		return err
	}
	s.Maps[m.Name] = nm
	if convert == nil {
		n := count(src.m)
		s.olds = append(s.olds, old{path: src.path, name: m.Name})
		src.m.Close()
		s.Results = append(s.Results, Result{Map: m.Name, From: src.path, To: curPath, Outcome: Lost, Entries: n})
		log := s.log.Info
		if m.State && n > 0 {
			log = s.log.Warn
		}
		log("pinned map of an older layout has no conversion: it starts empty", zap.String("map", m.Name),
			zap.String("from", src.path), zap.String("to", curPath), zap.Int("entries", n))
		return nil
	}
	copied, dropped := copyEntries(src.m, nm, convert, false)
	s.olds = append(s.olds, old{path: src.path, name: m.Name, from: src.m, to: nm, convert: convert})
	s.Results = append(s.Results, Result{Map: m.Name, From: src.path, To: curPath, Outcome: Migrated, Entries: copied, Dropped: dropped})
	s.log.Info("pinned map of an older layout migrated", zap.String("map", m.Name), zap.String("from", src.path),
		zap.String("to", curPath), zap.Int("entries", copied), zap.Int("dropped", dropped))
	return nil
}

func identity(k, v []byte) ([]byte, []byte, bool) { return k, v, true }

// perCPU: the map keeps a value per CPU.
func perCPU(t ebpf.MapType) bool {
	switch t {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash, ebpf.PerCPUCGroupStorage:
		return true
	}
	return false
}

// copyable: an entry read from the map can be written into another.
func copyable(t ebpf.MapType) bool {
	switch t {
	case ebpf.SockMap, ebpf.SockHash, ebpf.ReusePortSockArray, ebpf.ProgramArray, ebpf.DevMap, ebpf.DevMapHash, ebpf.CPUMap, ebpf.XSKMap:
		return false
	}
	return true
}

func ofMaps(t ebpf.MapType) bool { return t == ebpf.ArrayOfMaps || t == ebpf.HashOfMaps }

// keys lists the keys of m. A hash map that a program changes meanwhile may
// restart the walk (a deleted key): keys seen are not listed twice, and the walk
// stops after twice max_entries steps.
func keys(m *ebpf.Map) [][]byte {
	var out [][]byte
	seen := map[string]bool{}
	k := make([]byte, m.KeySize())
	var prev any
	for steps := 0; steps <= 2*int(m.MaxEntries()) && m.NextKey(prev, &k) == nil; steps++ {
		if !seen[string(k)] {
			seen[string(k)] = true
			out = append(out, slices.Clone(k))
		}
		prev = slices.Clone(k)
	}
	return out
}

// count is how many entries of m hold something (arrays: not all zero).
func count(m *ebpf.Map) int {
	n := 0
	for _, k := range keys(m) {
		if ofMaps(m.Type()) {
			var inner *ebpf.Map
			if m.Lookup(k, &inner) == nil {
				inner.Close()
				n++
			}
			continue
		}
		v, err := m.LookupBytes(k)
		if err == nil && slices.ContainsFunc(v, func(b byte) bool { return b != 0 }) {
			n++
		}
	}
	return n
}

// copyEntries copies every entry of from into to through convert; onlyNew
// copies only keys to lacks (the catch-up after the swap, for hash maps).
func copyEntries(from, to *ebpf.Map, convert Convert, onlyNew bool) (copied, dropped int) {
	array := from.Type() == ebpf.Array || from.Type() == ebpf.PerCPUArray || from.Type() == ebpf.ArrayOfMaps
	if onlyNew && array {
		return 0, 0
	}
	flags := ebpf.UpdateAny
	if onlyNew {
		flags = ebpf.UpdateNoExist
	}
	cpus, _ := ebpf.PossibleCPU()
	for _, k := range keys(from) {
		switch {
		case ofMaps(from.Type()):
			var inner *ebpf.Map
			if from.Lookup(k, &inner) != nil {
				continue
			}
			err := to.Update(k, inner, flags)
			inner.Close()
			if err != nil {
				dropped++
				continue
			}
		case perCPU(from.Type()):
			vals := make([][]byte, cpus)
			if from.Lookup(k, vals) != nil {
				continue
			}
			var nk []byte
			ok := true
			for i := range vals {
				var nv []byte
				nk, nv, ok = convert(k, vals[i])
				if !ok || len(nv) != int(to.ValueSize()) {
					ok = false
					break
				}
				vals[i] = nv
			}
			if !ok || len(nk) != int(to.KeySize()) || to.Update(nk, vals, flags) != nil {
				dropped++
				continue
			}
		default:
			v, err := from.LookupBytes(k)
			if err != nil || v == nil {
				continue
			}
			nk, nv, ok := convert(k, v)
			if !ok || len(nk) != int(to.KeySize()) || len(nv) != int(to.ValueSize()) || to.Update(nk, nv, flags) != nil {
				dropped++
				continue
			}
		}
		copied++
	}
	return copied, dropped
}

// Finish is called once the new program runs on the pinned link (or when none
// ran): it copies into the new maps what the old program wrote since Open (new
// keys of hash maps), then removes every older pin. A crash before Finish
// leaves the old pins, and the next start carries them over again.
func (s *Set) Finish() error {
	var errs []error
	for _, o := range s.olds {
		if o.from != nil {
			if n, _ := copyEntries(o.from, o.to, o.convert, true); n > 0 {
				s.log.Info("entries the old program made during the upgrade migrated", zap.String("map", o.name), zap.Int("entries", n))
			}
			o.from.Close()
		}
		if err := os.Remove(o.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove old pin %s: %w", o.path, err))
		}
	}
	s.olds = nil
	return errors.Join(errs...)
}

// CloseMaps releases the handles of Maps (the loader has its own once the
// program is loaded).
func (s *Set) CloseMaps() {
	for _, m := range s.Maps {
		m.Close()
	}
	s.Maps = nil
}

// Close releases every handle Open took. The pins stay, older ones too if
// Finish was not called.
func (s *Set) Close() {
	s.CloseMaps()
	for _, o := range s.olds {
		if o.from != nil {
			o.from.Close()
		}
	}
	s.olds = nil
}
