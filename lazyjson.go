package main

import (
	"bytes"
	"encoding/binary"
	"iter"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonValue is the raw text of one JSON value, read lazily. The Play Store
// sends protobuf messages as positional JSON arrays (~15 KB for an app, ~110 KB
// for a reviews page) of which playwatch reads a few dozen slots; walking the
// raw bytes to those slots is several times faster than decoding the whole tree
// and allocates almost nothing. A nil jsonValue means "absent". Every accessor
// tolerates malformed input: it never panics, and answers "absent" (get may
// also answer what the part before the damage holds).
type jsonValue []byte

// present reports whether v holds a value other than JSON null.
func (v jsonValue) present() bool {
	return len(v) > 0 && !v.isNull()
}

func (v jsonValue) isNull() bool { return string(v) == "null" }

func (v jsonValue) isArray() bool  { return len(v) > 1 && v[0] == '[' }
func (v jsonValue) isObject() bool { return len(v) > 1 && v[0] == '{' }
func (v jsonValue) isString() bool { return len(v) > 1 && v[0] == '"' }

// walkArray reads the array at b[i] in one pass. visit gets each element's
// index and start offset and returns the offset after it, having read the
// element however it needs (a nested record can be split in the same pass).
// walkArray returns the offset after the array; ok is false when b[i] is not
// an array, the array is malformed, or visit says so.
func walkArray(b []byte, i int, visit func(n, start int) (end int, ok bool)) (int, bool) {
	if i >= len(b) || b[i] != '[' {
		return 0, false
	}
	j := skipSpace(b, i+1)
	if j < len(b) && b[j] == ']' {
		return j + 1, true
	}
	for n := 0; ; n++ {
		end, ok := visit(n, skipSpace(b, j))
		if !ok {
			return 0, false
		}
		j = skipSpace(b, end)
		switch {
		case j >= len(b):
			return 0, false
		case b[j] == ']':
			return j + 1, true
		case b[j] != ',':
			return 0, false
		}
		j++
	}
}

// elements yields the elements of an array in order; nothing when v is not an
// array. It stops at the first malformed element.
func (v jsonValue) elements() iter.Seq2[int, jsonValue] {
	return func(yield func(int, jsonValue) bool) {
		walkArray(v, 0, func(n, start int) (int, bool) {
			s, e, ok := scanValue(v, start)
			return e, ok && yield(n, v[s:e])
		})
	}
}

// index returns element i of an array, applying the rule for sparse protobuf
// arrays (docs/playstore-protocol.md §2.4): when the array is cut short, high
// fields live in a trailing object keyed by field number (index+1). It reads
// no further than element i.
func (v jsonValue) index(i int) jsonValue { return v.seek(i, false) }

// seek is index. With open set, an element i that is an array is returned
// from its start to the end of v, without finding where it ends: get reads
// only its beginning, and scanning it whole would read it twice.
func (v jsonValue) seek(i int, open bool) jsonValue {
	pos, ok := v.firstElement()
	for n := 0; ok && i >= 0; n++ {
		if open && n == i {
			// An array cannot be the trailing object of the sparse rule.
			if p := skipSpace(v, pos); p < len(v) && v[p] == '[' {
				return v[p:]
			}
		}
		e, next, last, valid := v.element(pos)
		switch {
		case !valid:
			return nil
		case n == i && !(last && e.isObject()):
			return e
		case last && e.isObject():
			return e.key(strconv.Itoa(i + 1))
		case last:
			return nil
		}
		pos = next
	}
	return nil
}

// firstElement returns where the first element of an array starts; ok is false
// when v is not an array or is empty.
func (v jsonValue) firstElement() (int, bool) {
	if !v.isArray() {
		return 0, false
	}
	i := skipSpace(v, 1)
	return i, i < len(v) && v[i] != ']'
}

// element reads the array element that starts at v[i]: next is where the
// following one starts, last tells that the array closes after this one.
func (v jsonValue) element(i int) (e jsonValue, next int, last, ok bool) {
	start, end, ok := scanValue(v, i)
	if !ok {
		return nil, 0, false, false
	}
	j := skipSpace(v, end)
	if j >= len(v) {
		return nil, 0, false, false
	}
	switch v[j] {
	case ',':
		return v[start:end], j + 1, false, true
	case ']':
		return v[start:end], j, true, true
	}
	return nil, 0, false, false
}

// splitArray splits the first len(dst) slots of the array at b[i] into dst
// in one pass, by the rule of index; absent slots are nil. Reading many
// slots of one record this way scans it once instead of once per slot. It
// returns the offset after the array.
func splitArray(b []byte, i int, dst []jsonValue) (int, bool) {
	clear(dst)
	// The last element is kept as offsets: storing a slice per element costs
	// a write barrier each while the GC runs.
	lastStart, lastEnd, slots := 0, 0, 0
	end, ok := walkArray(b, i, func(n, start int) (int, bool) {
		s, e, ok := scanValue(b, start)
		if !ok {
			return 0, false
		}
		lastStart, lastEnd, slots = s, e, n+1
		if n < len(dst) {
			dst[n] = b[s:e]
		}
		return e, true
	})
	if last := jsonValue(b[lastStart:lastEnd]); ok && last.isObject() {
		for k := slots - 1; k < len(dst); k++ {
			dst[k] = last.key(strconv.Itoa(k + 1))
		}
	}
	return end, ok
}

// eachRecord calls fn for every element of the array at b[i] with the
// element's first len(dst) slots split into dst (all nil for an element that
// is not an array), reading every byte once. It returns the offset after the
// array.
func eachRecord(b []byte, i int, dst []jsonValue, fn func(rec []jsonValue)) (int, bool) {
	return walkArray(b, i, func(_, start int) (int, bool) {
		var end int
		var ok bool
		if start < len(b) && b[start] == '[' {
			end, ok = splitArray(b, start, dst)
		} else {
			clear(dst)
			_, end, ok = scanValue(b, start)
		}
		if ok {
			fn(dst)
		}
		return end, ok
	})
}

// get follows a path of array indexes, applying index at every level. Only
// the value at the end of the path is scanned whole; on malformed input, the
// levels above it may be read as far as they go.
func (v jsonValue) get(path ...int) jsonValue {
	for k, i := range path {
		if !v.isArray() {
			return nil
		}
		v = v.seek(i, k < len(path)-1)
	}
	return v
}

// key returns the member k of an object, or nil. Like encoding/json, the
// last of duplicate members wins.
func (v jsonValue) key(k string) jsonValue {
	var found jsonValue
	v.members(func(name string, value jsonValue) {
		if name == k {
			found = value
		}
	})
	return found
}

// members calls fn for each member of an object, in order, stopping at the
// first malformed one.
func (v jsonValue) members(fn func(name string, value jsonValue)) {
	if !v.isObject() {
		return
	}
	i := skipSpace(v, 1)
	for i < len(v) && v[i] == '"' {
		ks, ke, ok := scanValue(v, i)
		if !ok {
			return
		}
		name, ok := jsonValue(v[ks:ke]).str()
		i = skipSpace(v, ke)
		if !ok || i >= len(v) || v[i] != ':' {
			return
		}
		vs, ve, ok := scanValue(v, i+1)
		if !ok {
			return
		}
		fn(name, v[vs:ve])
		i = skipSpace(v, ve)
		if i >= len(v) || v[i] != ',' {
			return
		}
		i = skipSpace(v, i+1)
	}
}

// keys lists the member names of an object in order.
func (v jsonValue) keys() []string {
	var names []string
	v.members(func(name string, _ jsonValue) { names = append(names, name) })
	return names
}

// str decodes a JSON string. Invalid UTF-8 and lone surrogates become U+FFFD,
// as encoding/json does.
func (v jsonValue) str() (string, bool) {
	if !v.isString() || v[len(v)-1] != '"' {
		return "", false
	}
	body := v[1 : len(v)-1]
	if plainJSONString(body) {
		return string(body), true
	}
	var buf [256]byte // most escaped strings decode here, not on the heap
	b, end, ok := appendUnquoted(buf[:0], v, 0)
	if !utf8.Valid(b) {
		// Escapes decode to whole runes, so repairing the decoded text
		// replaces the same bytes as repairing each run between them.
		b = appendValidUTF8(nil, b)
	}
	return string(b), ok && end == len(v)
}

// strPtr returns the decoded string, or nil when absent or not a string.
func (v jsonValue) strPtr() *string { return ptrIfOK(v.str()) }

// int64 decodes an integral JSON number (1e3 and 5.0 included).
func (v jsonValue) int64() (int64, bool) {
	if n, ok := smallInt(v); ok {
		return n, true
	}
	if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
		return n, true
	}
	f, ok := v.float64()
	if !ok || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// smallInt is the allocation-free path for the common case: up to 18 digits.
func smallInt(v []byte) (int64, bool) {
	digits := v
	if len(v) > 0 && v[0] == '-' {
		digits = v[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if len(digits) < len(v) {
		n = -n
	}
	return n, true
}

func (v jsonValue) int64Ptr() *int64 { return ptrIfOK(v.int64()) }

// float64 decodes a JSON number.
func (v jsonValue) float64() (float64, bool) {
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return 0, false
	}
	return f, true
}

func (v jsonValue) float64Ptr() *float64 { return ptrIfOK(v.float64()) }

// ptrIfOK is &x when ok, else nil: a decoded value, or nil when it was
// absent or of another type.
func ptrIfOK[T any](x T, ok bool) *T {
	if !ok {
		return nil
	}
	return &x
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// scanValue finds the value that starts at b[i] (after optional whitespace)
// and returns its bounds. It checks structure only as far as needed to find
// the end; the accessors check the rest when they decode.
func scanValue(b []byte, i int) (start, end int, ok bool) {
	i = skipSpace(b, i)
	if i >= len(b) {
		return 0, 0, false
	}
	switch c := b[i]; {
	case c == '"':
		end, ok = scanString(b, i)
	case c == '[' || c == '{':
		end, ok = scanContainer(b, i)
	case c == 't':
		end, ok = scanLiteral(b, i, "true")
	case c == 'f':
		end, ok = scanLiteral(b, i, "false")
	case c == 'n':
		end, ok = scanLiteral(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		end, ok = scanNumber(b, i)
	}
	if !ok {
		return 0, 0, false
	}
	return i, end, true
}

// scanString returns the offset after the closing quote of the string at
// b[i]. Short strings (names, ids) are walked byte by byte; past 16 bytes
// IndexByte takes over, which runs vectorized on long review texts.
func scanString(b []byte, i int) (int, bool) {
	j := i + 1
	for stop := min(len(b), j+16); j < stop; j++ {
		switch b[j] {
		case '"':
			return j + 1, true
		case '\\':
			j++ // the escaped byte cannot end the string
		}
	}
	for j < len(b) {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false
		}
		q := j + k
		backslashes := 0
		for p := q - 1; p >= j && b[p] == '\\'; p-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return q + 1, true
		}
		j = q + 1
	}
	return 0, false
}

// scanContainer returns the offset after the bracket closing the array or
// object at b[i], checking that brackets pair up.
func scanContainer(b []byte, i int) (int, bool) {
	var stackBuf [32]byte
	stack := stackBuf[:0]
	for j := i; j < len(b); j++ {
		c := b[j]
		// Fast skip: '[' and ']' are '{' and '}' with bit 5 cleared.
		if x := c | 0x20; x != '{' && x != '}' && c != '"' {
			continue
		}
		switch c {
		case '"':
			end, ok := scanString(b, j)
			if !ok {
				return 0, false
			}
			j = end - 1
		case '[':
			stack = append(stack, ']')
		case '{':
			stack = append(stack, '}')
		case ']', '}':
			if len(stack) == 0 || stack[len(stack)-1] != c {
				return 0, false
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return j + 1, true
			}
		}
	}
	return 0, false
}

func scanLiteral(b []byte, i int, lit string) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return 0, false
	}
	return i + len(lit), true
}

func scanNumber(b []byte, i int) (int, bool) {
	j := i
	for j < len(b) {
		c := b[j]
		if (c < '0' || c > '9') && c != '-' && c != '+' && c != '.' && c != 'e' && c != 'E' {
			break
		}
		j++
	}
	return j, j > i
}

// plainJSONString reports whether a string body needs no unescaping: no
// backslash and valid UTF-8.
func plainJSONString(body []byte) bool {
	return bytes.IndexByte(body, '\\') < 0 && utf8.Valid(body)
}

// appendUnquoted decodes the JSON string that opens at b[i], appends it to
// out and returns the offset after its closing quote: finding the end and
// decoding take one pass, which matters for a batchexecute payload (~110 KB
// of JSON text inside one string). Invalid UTF-8 is kept as it is (str
// repairs it). Raw control characters, invalid in JSON, are kept too
// (cleanText drops them).
func appendUnquoted(out, b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return out, 0, false
	}
	// The text is copied a word at a time into dst, written past n as far
	// as the next word: decoding never lengthens the text, so this room is
	// enough.
	n := len(out)
	out = slices.Grow(out, len(b)-i+8)
	dst := out[:cap(out)]
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for j := i + 1; ; {
		// The runs between escapes are short (a payload escapes every quote
		// of the text inside), so the next quote or backslash is sought
		// eight bytes at a time, with the has-a-zero-byte test on the word
		// xored with each, rather than with a call per run.
		for j+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[j:])
			binary.LittleEndian.PutUint64(dst[n:], x)
			q, s := x^(ones*'"'), x^(ones*'\\')
			// The lowest flagged byte is exact; flags above it may not be.
			if m := ((q-ones)&^q | (s-ones)&^s) & highs; m != 0 {
				k := bits.TrailingZeros64(m) >> 3
				j, n = j+k, n+k
				break
			}
			j, n = j+8, n+8
		}
		for j < len(b) && b[j] != '"' && b[j] != '\\' {
			dst[n] = b[j]
			j, n = j+1, n+1
		}
		switch {
		case j >= len(b):
			return out, 0, false
		case b[j] == '"':
			return dst[:n], j + 1, true
		case j+1 >= len(b):
			return out, 0, false
		}
		c := b[j+1]
		j += 2
		switch c {
		case '"', '\\', '/':
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		case 'u':
			r, ok := hex4(b[j:])
			if !ok {
				return out, 0, false
			}
			j += 4
			if utf16.IsSurrogate(r) {
				// A pair decodes to one rune; a lone half becomes U+FFFD.
				high := r
				r = utf8.RuneError
				if j+6 <= len(b) && b[j] == '\\' && b[j+1] == 'u' {
					if low, ok := hex4(b[j+2:]); ok {
						if pair := utf16.DecodeRune(high, low); pair != utf8.RuneError {
							r = pair
							j += 6
						}
					}
				}
			}
			n += utf8.EncodeRune(dst[n:], r)
			continue
		default:
			return out, 0, false
		}
		dst[n] = c
		n++
	}
}

// appendValidUTF8 appends run, each invalid byte replaced by U+FFFD.
func appendValidUTF8(out, run []byte) []byte {
	if utf8.Valid(run) {
		return append(out, run...)
	}
	for len(run) > 0 {
		r, size := utf8.DecodeRune(run)
		out = utf8.AppendRune(out, r)
		run = run[size:]
	}
	return out
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
