package pgwire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// countingReader counts the bytes ReadPacket consumes.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// verdict is what ReadPacket decided, comparable across runs.
type verdict struct {
	kind      Kind
	params    map[string]string
	cancelPID uint32
	cancelKey string
	errKind   string
	errMsg    string
	consumed  int
}

func judge(data []byte) verdict {
	cr := &countingReader{r: bytes.NewReader(data)}
	pkt, err := ReadPacket(cr)
	v := verdict{kind: pkt.Kind, consumed: cr.n}
	if pkt.Startup != nil {
		v.params = pkt.Startup.Parameters
	}
	if pkt.Cancel != nil {
		v.cancelPID, v.cancelKey = pkt.Cancel.ProcessID, string(pkt.Cancel.SecretKey)
	}
	var perr *ProtocolError
	switch {
	case err == nil:
	case errors.As(err, &perr):
		v.errKind, v.errMsg = "protocol", perr.Msg
	case errors.Is(err, io.EOF):
		v.errKind = "eof"
	default:
		v.errKind, v.errMsg = "other", err.Error()
	}
	return v
}

func FuzzReadPacket(f *testing.F) {
	startup, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "u", "database": "app", "application_name": "x"}}).Encode(nil)
	startup32, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion32,
		Parameters: map[string]string{"user": "u"}}).Encode(nil)
	cancel, _ := (&pgproto3.CancelRequest{ProcessID: 7, SecretKey: make([]byte, 32)}).Encode(nil)
	for _, seed := range [][]byte{
		startup, startup32, cancel,
		packet(sslRequestCode, nil), packet(gssEncRequestCode, nil),
		{0x16, 0x03, 0x01, 0x00, 0x05}, // a TLS record header
		{0, 0, 0x27, 0x15, 0, 3, 0, 0}, // length just over the limit
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		{},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a := judge(data)
		// Never reads (and so never buffers) beyond one maximal packet.
		if a.consumed > 4+MaxStartupPacketLen {
			t.Fatalf("consumed %d bytes, limit %d", a.consumed, 4+MaxStartupPacketLen)
		}
		if a.errKind == "other" {
			t.Fatalf("unclassified error %q", a.errMsg)
		}
		if a.errKind == "" && a.kind == 0 {
			t.Fatal("no error and no packet")
		}
		// The same input always gets the same verdict.
		if b := judge(data); !reflect.DeepEqual(a, b) {
			t.Fatalf("verdicts differ: %+v vs %+v", a, b)
		}
	})
}

// TestReadPacketAllocationBound checks that a hostile length word costs
// nothing: the length is checked before the body is allocated.
func TestReadPacketAllocationBound(t *testing.T) {
	huge := []byte{0x7f, 0xff, 0xff, 0xff}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 100
	for range runs {
		_, _ = ReadPacket(bytes.NewReader(huge))
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 1024 {
		t.Fatalf("%d bytes allocated per rejected 2 GiB length word, want under 1 KiB", per)
	}
}
