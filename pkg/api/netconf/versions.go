package netconf

// CNIVersions are the configuration versions the plugin speaks: the
// plugin declares them to the runtime (VERSION), the installer refuses a
// configuration of any other, and the root tests run every verb in each.
var CNIVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// LatestCNIVersion is the newest of CNIVersions.
var LatestCNIVersion = CNIVersions[len(CNIVersions)-1]
