import DataProtectionKeybag

extension ProtectionClass {
    /// The class of the WAL index (`NAME-shm`) of an SQLite database of this class: class C
    /// where the database is class A, else the database's own.
    ///
    /// SQLite maps the index and touches it at every statement. At class A's lock the protected
    /// file system takes back the pages of class-A files (a mapped page faults), which would kill
    /// a program holding a class-A WAL database open; the index holds no row data (the WAL's frame
    /// and page numbers, salts and checksums), so it stays available from the first unlock on,
    /// and the program's statements fail with an error while locked instead (FORMAT.md §14).
    package var walIndexClass: ProtectionClass {
        self == .complete ? .completeUntilFirstUserAuthentication : self
    }
}
