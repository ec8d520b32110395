package pgwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

func packet(code uint32, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, body...)
}

func TestReadPacket(t *testing.T) {
	t.Parallel()
	startup, err := (&pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters:      map[string]string{"user": "u", "database": "app"},
	}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel := packet(cancelRequestCode, []byte{0, 0, 0, 7, 1, 2, 3, 4})
	oversized := binary.BigEndian.AppendUint32(nil, MaxStartupPacketLen+5)

	tests := []struct {
		name     string
		in       []byte
		kind     Kind
		protoErr bool
		eof      bool
	}{
		{name: "startup", in: startup, kind: KindStartup},
		{name: "ssl", in: packet(sslRequestCode, nil), kind: KindSSLRequest},
		{name: "gssenc", in: packet(gssEncRequestCode, nil), kind: KindGSSEncRequest},
		{name: "cancel", in: cancel, kind: KindCancel},
		{name: "nothing", in: nil, eof: true},
		{name: "short length word", in: []byte{0, 0}, protoErr: true},
		{name: "length below minimum", in: []byte{0, 0, 0, 4}, protoErr: true},
		{name: "oversized", in: oversized, protoErr: true},
		{name: "truncated body", in: startup[:len(startup)-3], protoErr: true},
		{name: "unknown version", in: packet(0x00020000, []byte("user\x00u\x00\x00")), protoErr: true},
		{name: "unterminated parameters", in: packet(pgproto3.ProtocolVersion30, []byte("user\x00u")), protoErr: true},
		{name: "ssl with body", in: packet(sslRequestCode, []byte{1}), protoErr: true},
		{name: "cancel too short", in: packet(cancelRequestCode, []byte{1}), protoErr: true},
		{name: "http", in: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), protoErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pkt, err := ReadPacket(bytes.NewReader(tt.in))
			var perr *ProtocolError
			switch {
			case tt.eof:
				if !errors.Is(err, io.EOF) {
					t.Fatalf("err = %v, want io.EOF", err)
				}
			case tt.protoErr:
				if !errors.As(err, &perr) {
					t.Fatalf("err = %v, want *ProtocolError", err)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if pkt.Kind != tt.kind {
					t.Fatalf("kind = %v, want %v", pkt.Kind, tt.kind)
				}
			}
		})
	}
}

func TestReadPacketLeavesFollowingBytes(t *testing.T) {
	t.Parallel()
	// The proxy hands the socket to a byte pipe after the first packets;
	// anything the client sent after them must still be unread.
	in := append(packet(sslRequestCode, nil), "rest"...)
	r := bytes.NewReader(in)
	if _, err := ReadPacket(r); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "rest" {
		t.Fatalf("left %q, want %q", rest, "rest")
	}
}

func TestReadPacketStartupParameters(t *testing.T) {
	t.Parallel()
	in, err := (&pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters:      map[string]string{"user": "alice", "database": "app", "application_name": "x"},
	}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	pkt, err := ReadPacket(bytes.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := pkt.Startup.Parameters["database"]; got != "app" {
		t.Fatalf("database = %q", got)
	}
	if got := pkt.Startup.Parameters["application_name"]; got != "x" {
		t.Fatalf("application_name = %q", got)
	}
}

func TestWriteErrorRoundTrip(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := WriteError(&buf, CodeInvalidCatalogName, "no such project", "Known projects: a"); err != nil {
		t.Fatal(err)
	}
	fe := pgproto3.NewFrontend(&buf, io.Discard)
	msg, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	er, ok := msg.(*pgproto3.ErrorResponse)
	if !ok {
		t.Fatalf("got %T", msg)
	}
	if er.Code != CodeInvalidCatalogName || er.Severity != "FATAL" || er.Hint != "Known projects: a" {
		t.Fatalf("got %+v", er)
	}
}

// TestReadPacketErrorMessages pins the 08P01 message text: lengths and
// protocol codes are printed unsigned, exactly as the client sent them.
func TestReadPacketErrorMessages(t *testing.T) {
	t.Parallel()
	length := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"huge length", length(0xFFFFFFF0), "invalid length of startup packet: 4294967280"},
		{"all ones length", length(0xFFFFFFFF), "invalid length of startup packet: 4294967295"},
		{"sign bit length", length(0x80000000), "invalid length of startup packet: 2147483648"},
		{"zero length", length(0), "invalid length of startup packet: 0"},
		{"length 7", length(7), "invalid length of startup packet: 7"},
		{"oversized length", length(MaxStartupPacketLen + 5), "invalid length of startup packet: 10005"},
		{"version 2.0", packet(0x00020000, nil), "unsupported frontend protocol 2.0"},
		{"high version", packet(0xFFFF0000, nil), "unsupported frontend protocol 65535.0"},
		{"high minor", packet(0x0003FFFF, nil), "unsupported frontend protocol 3.65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ReadPacket(bytes.NewReader(tt.in))
			var perr *ProtocolError
			if !errors.As(err, &perr) {
				t.Fatalf("err = %v, want *ProtocolError", err)
			}
			if perr.Msg != tt.want {
				t.Fatalf("message = %q, want %q", perr.Msg, tt.want)
			}
		})
	}
}

// TestReadPacketLengthLimits: the largest accepted length word is
// MaxStartupPacketLen plus the length word itself; one more is rejected.
func TestReadPacketLengthLimits(t *testing.T) {
	t.Parallel()
	maxBody := make([]byte, MaxStartupPacketLen-4)
	if _, err := ReadPacket(bytes.NewReader(packet(sslRequestCode, maxBody))); err == nil || err.Error() != "malformed SSLRequest" {
		t.Fatalf("SSLRequest at the length limit: err = %v, want malformed SSLRequest (length accepted)", err)
	}
	over := packet(sslRequestCode, append(maxBody, 0))
	if _, err := ReadPacket(bytes.NewReader(over)); err == nil || err.Error() != "invalid length of startup packet: 10005" {
		t.Fatalf("one byte over the limit: err = %v", err)
	}
}

func TestDecodeUpstreamErrorLength(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		length uint32
		want   string
	}{
		{0xFFFFFFF0, "invalid length of upstream error response: 4294967280"},
		{0, "invalid length of upstream error response: 0"},
		{maxErrorBody + 5, "invalid length of upstream error response: 65541"},
	} {
		var h ReplyHeader
		h[0] = 'E'
		binary.BigEndian.PutUint32(h[1:], tt.length)
		_, _, err := DecodeUpstreamError(bytes.NewReader(nil), h)
		if err == nil || err.Error() != tt.want {
			t.Errorf("length %#x: err = %v, want %q", tt.length, err, tt.want)
		}
	}
}
