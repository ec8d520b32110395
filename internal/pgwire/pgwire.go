// Package pgwire reads the first packets a Postgres client sends (SSLRequest,
// GSSENCRequest, CancelRequest, StartupMessage) and writes ErrorResponses.
// It reads exactly the bytes of each packet and never buffers ahead, so the
// connection can be handed to a byte pipe afterwards without losing data.
package pgwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgproto3"
)

// MaxStartupPacketLen is Postgres's MAX_STARTUP_PACKET_LENGTH: the largest
// startup packet body (after the length word) a server accepts.
const MaxStartupPacketLen = 10000

// Request codes from the Postgres protocol (the first word after the length).
const (
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
	cancelRequestCode = 80877102
)

// SQLSTATE codes pgwake sends to clients.
const (
	CodeInvalidCatalogName  = "3D000" // unknown project
	CodeProtocolViolation   = "08P01" // malformed startup packet
	CodeTooManyConnections  = "53300"
	CodeConnectionFailure   = "08006" // wake failed or timed out
	CodeAdminShutdown       = "57P01" // pgwake is shutting down
	CodeCannotConnectNow    = "57P03" // upstream is still starting
	CodeFeatureNotSupported = "0A000"
	CodeInvalidPassword     = "28P01" // wrong password at the proxy
	CodeInternalError       = "XX000"
)

// ProtocolError is a malformed first packet. The proxy answers it with
// SQLSTATE 08P01.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return e.Msg }

func protoErr(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}

// Kind tells which first packet was read.
type Kind int

const (
	KindStartup Kind = iota + 1
	KindSSLRequest
	KindGSSEncRequest
	KindCancel
)

// Packet is one decoded first packet. Exactly one of Startup or Cancel is set
// for KindStartup and KindCancel; SSL and GSSENC requests carry no body.
type Packet struct {
	Kind    Kind
	Startup *pgproto3.StartupMessage
	Cancel  *pgproto3.CancelRequest
}

// ReadPacket reads one length-prefixed first packet from r. An io.EOF before
// the first byte is returned as is, so callers can tell a client that sent
// nothing from one that sent garbage; every malformed packet is a
// *ProtocolError.
func ReadPacket(r io.Reader) (Packet, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Packet{}, protoErr("incomplete startup packet")
		}
		return Packet{}, err
	}
	// The length word is unsigned on the wire and counts itself; messages
	// print it exactly as sent.
	length := binary.BigEndian.Uint32(hdr[:])
	n := int64(length) - 4
	// 4 bytes of code is the smallest valid body; the limit is checked
	// before allocating so a hostile length costs nothing.
	if n < 4 || n > MaxStartupPacketLen {
		return Packet{}, protoErr("invalid length of startup packet: %d", length)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Packet{}, protoErr("incomplete startup packet")
		}
		return Packet{}, err
	}
	switch code := binary.BigEndian.Uint32(body); code {
	case pgproto3.ProtocolVersion30, pgproto3.ProtocolVersion32:
		var m pgproto3.StartupMessage
		if err := m.Decode(body); err != nil {
			return Packet{}, protoErr("malformed startup packet: %v", err)
		}
		return Packet{Kind: KindStartup, Startup: &m}, nil
	case sslRequestCode:
		if n != 4 {
			return Packet{}, protoErr("malformed SSLRequest")
		}
		return Packet{Kind: KindSSLRequest}, nil
	case gssEncRequestCode:
		if n != 4 {
			return Packet{}, protoErr("malformed GSSENCRequest")
		}
		return Packet{Kind: KindGSSEncRequest}, nil
	case cancelRequestCode:
		var m pgproto3.CancelRequest
		if err := m.Decode(body); err != nil {
			return Packet{}, protoErr("malformed CancelRequest: %v", err)
		}
		return Packet{Kind: KindCancel, Cancel: &m}, nil
	default:
		major, minor := code>>16, code&0xffff
		return Packet{}, protoErr("unsupported frontend protocol %d.%d", major, minor)
	}
}

// EncodeStartup encodes a startup message, including its length word.
func EncodeStartup(m *pgproto3.StartupMessage) ([]byte, error) {
	return m.Encode(nil)
}

// WriteError sends a FATAL ErrorResponse. The caller closes the connection.
func WriteError(w io.Writer, code, msg, hint string) error {
	e := &pgproto3.ErrorResponse{
		Severity:            "FATAL",
		SeverityUnlocalized: "FATAL",
		Code:                code,
		Message:             msg,
		Hint:                hint,
	}
	buf, err := e.Encode(nil)
	if err != nil {
		return fmt.Errorf("encode error response: %w", err)
	}
	_, err = w.Write(buf)
	return err
}

// ReplyHeader is the type byte and length word of a backend message.
type ReplyHeader [5]byte

// Type is the message type byte ('R' authentication, 'E' error, ...).
func (h ReplyHeader) Type() byte { return h[0] }

// Len is the length word exactly as sent (it counts itself), for messages
// that print it.
func (h ReplyHeader) Len() uint32 { return binary.BigEndian.Uint32(h[1:]) }

// BodyLen is the message length minus the length word itself. A length
// word of 2^31 or more is negative here, so a check for n < 0 rejects it.
func (h ReplyHeader) BodyLen() int { return int(int32(h.Len())) - 4 }

// maxErrorBody bounds how much of an upstream ErrorResponse is read while
// peeking; real ones are a few hundred bytes.
const maxErrorBody = 64 << 10

// DecodeUpstreamError reads the body of an 'E' message whose header was
// already read and decodes it.
func DecodeUpstreamError(r io.Reader, h ReplyHeader) (*pgproto3.ErrorResponse, []byte, error) {
	n := h.BodyLen()
	if n < 0 || n > maxErrorBody {
		return nil, nil, fmt.Errorf("invalid length of upstream error response: %d", h.Len())
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, nil, fmt.Errorf("read upstream error response: %w", err)
	}
	var e pgproto3.ErrorResponse
	if err := e.Decode(body); err != nil {
		return nil, nil, fmt.Errorf("decode upstream error response: %w", err)
	}
	return &e, body, nil
}
