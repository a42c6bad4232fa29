// swift-tools-version: 6.0
// A package that depends on DataProtection's library products, as an app developer's would.
// .ci/run builds it on a fresh machine (no TPM headers, nothing but the toolchain, libsqlite3-dev
// and libssl-dev): the fresh-machine rule in CONTRIBUTING.md. DATAPROTECTION_PATH names the clone.
import Foundation
import PackageDescription

// A path whose last component is DataProtection (the package identity SwiftPM derives from it).
let dataProtection = ProcessInfo.processInfo.environment["DATAPROTECTION_PATH"] ?? "../../../DataProtection"

let package = Package(
    name: "Consumer",
    platforms: [.macOS(.v15)],
    dependencies: [.package(path: dataProtection)],
    targets: [
        .executableTarget(name: "Consumer", dependencies: [
            .product(name: "DataProtection", package: "DataProtection"),
            .product(name: "DataProtectionBackup", package: "DataProtection"),
            .product(name: "DataProtectionSQLite", package: "DataProtection"),
            .product(name: "DataProtectionFileSystem", package: "DataProtection"),
            .product(name: "DataProtectionObjects", package: "DataProtection"),
            .product(name: "DataProtectionContainers", package: "DataProtection"),
            .product(name: "DataProtectionSharing", package: "DataProtection"),
            .product(name: "DataProtectionLifecycle", package: "DataProtection"),
            .product(name: "DataProtectionAudit", package: "DataProtection"),
        ]),
    ]
)
