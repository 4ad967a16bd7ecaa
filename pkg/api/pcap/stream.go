package pcap

// The capture stream on a stack's control socket: GET StreamPath (with
// SnapLenQuery) streams pcap (WritePcapHeader, WritePcapRecord) until the
// client goes or POSTs StopPath with the session's HeaderID in
// SessionIDForm; the trailers count what was sent and dropped.
const (
	HeaderID      = "Capture-Id"
	TrailerSent   = "Capture-Packets"
	TrailerDrops  = "Capture-Dropped"
	StreamPath    = "/capture"
	StopPath      = "/capture/stop"
	SnapLenQuery  = "snaplen"
	SessionIDForm = "id"
)
