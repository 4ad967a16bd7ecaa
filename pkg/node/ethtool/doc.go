// Package ethtool reads and sets a link's offload features over the
// SIOCETHTOOL ioctl and rtnetlink: the GSO a link offers (Detect, for
// offload.Decide), segmentation offloads off on the stack's side of the
// veth, GRO on the node's side.
package ethtool
