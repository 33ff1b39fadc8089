#pragma once
// Layering fixture: a tenant header reaching up into the session part.
#include "server/session/client_session.hpp"
