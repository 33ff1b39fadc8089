#pragma once
// Layering fixture: the session part's header that the tenant part must not include.
